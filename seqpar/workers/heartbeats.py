"""Which rank of a running trial stopped answering: each rank's heartbeat is asked on its own (one
call in flight per rank, answered by the actor's second thread while the trial occupies the first),
so one silent rank cannot hide the others' answers, as one `ray.get` over all of them did.

A rank whose heartbeat has been silent for SEQPAR_HEARTBEAT_SILENT_S (30 s) while another rank of
the gang answered within that time is frozen: its process stopped (SIGSTOP, a hung driver call, a
wedged NIC or GPU) or its node is gone, and the trial ends then, before its timeout. Why 30 s: an
answer needs the GIL for a moment, and on a loaded host (8 ranks on 2 cores, a rank in a long
kernel, a garbage collection) answers of a few seconds were seen; a frozen rank never answers, so
waiting longer only delays the verdict. Requiring another rank's recent answer keeps a stalled
driver (or a lost link to every node) from blaming a rank.

    beats = Heartbeats(gang.actors, gang.info, started=time.monotonic())
    beats.poll(running)                 # every WATCH_S while the trial runs
    frozen = beats.frozen(running, silent_s)
    cause = beats.describe(running, frozen)
"""

from __future__ import annotations

import time
from typing import Any

SILENT_ENV_VAR, DEFAULT_SILENT_S = "SEQPAR_HEARTBEAT_SILENT_S", 30.0
WATCH_S = 2.0          # how often the driver asks the running ranks
LAST_ASK_S = 5.0       # at the trial's timeout: how long each rank gets to answer once more
NOTED_SILENT_S = 3 * WATCH_S  # at the timeout, a rank silent this long is named as not answering


def node_text(info: dict[str, Any]) -> str:
    """`ip (node id[:8])` of a rank's node (its `info()`)."""
    return f"{info.get('ip', '?')} ({str(info.get('node_id', ''))[:8] or '?'})"


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


class Heartbeats:
    """The running ranks' last answers (see the module docstring)."""

    def __init__(self, actors: list[Any], info: list[dict[str, Any]], started: float):
        self.actors, self.info = actors, info
        self.answered = dict.fromkeys(range(len(actors)), started)  # when each last answered
        self.beat: dict[int, dict[str, Any]] = {}   # each rank's last heartbeat
        self._asked: dict[int, Any] = {}            # the call in flight per rank
        self.last_poll = started

    def heard(self, rank: int) -> None:
        """The rank answered some other way (its result arrived)."""
        self.answered[rank] = time.monotonic()

    def poll(self, ranks: list[int]) -> None:
        """Collect the answers that came, ask again those that answered (never two at once)."""
        import ray

        self.last_poll = time.monotonic()
        asked = {ref: r for r, ref in self._asked.items()}
        if asked:
            ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0)
            for ref in ready:
                rank = asked[ref]
                del self._asked[rank]
                try:
                    self.beat[rank] = ray.get(ref)
                    self.answered[rank] = time.monotonic()
                except Exception:  # the actor died: its trial call says how
                    pass
        for rank in ranks:
            if rank not in self._asked:
                self._asked[rank] = self.actors[rank].heartbeat.remote()

    def frozen(self, ranks: list[int], silent_s: float) -> list[int]:
        """The running ranks silent for `silent_s`, when another rank answered within it."""
        now = time.monotonic()
        silent = [r for r in ranks if now - self.answered[r] >= silent_s]
        alive = any(now - t < silent_s for r, t in self.answered.items() if r not in silent)
        return silent if silent and alive else []

    def ask_all(self, ranks: list[int], timeout_s: float = LAST_ASK_S) -> None:
        """Each rank's heartbeat once more (in parallel, each with `timeout_s`)."""
        import ray

        refs = {self._asked.get(r) or self.actors[r].heartbeat.remote(): r for r in ranks}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                self.beat[refs[ref]] = ray.get(ref)
                self.answered[refs[ref]] = time.monotonic()
            except Exception:
                pass

    def _where(self, rank: int) -> str:
        beat = self.beat.get(rank)
        if beat is None:
            return " (no heartbeat since the trial began)"
        waiting = f" ({beat['waiting']})" if beat.get("waiting") else ""
        return f" in {beat['phase']!r}{waiting}"

    def describe(self, ranks: list[int], silent: list[int]) -> str:
        """`rank 1 on node 10.0.0.7 (3f2a9c01) stopped answering in 'measure' (all_to_all on sp)
        for 40 s; ranks 0, 2, 3 waiting (all_to_all on sp)`; without a silent rank, where each
        running rank is."""
        now = time.monotonic()
        parts = [f"rank {r} on node {node_text(self.info[r]) if r < len(self.info) else '?'} "
                 f"stopped answering{self._where(r)} for {now - self.answered[r]:.0f} s"
                 for r in silent]
        others = [r for r in ranks if r not in silent]
        if silent:
            if others:
                waits = sorted({self.beat[r]["waiting"] for r in others
                                if self.beat.get(r, {}).get("waiting")})
                parts.append(f"{ranks_text(others)} waiting"
                             + (f" ({', '.join(waits)})" if waits else ""))
            return "; ".join(parts)
        where = []
        for r in ranks:
            beat = self.beat.get(r)
            if beat is None:
                where.append(f"{r} (no answer)")
                continue
            waiting = f" ({beat['waiting']})" if beat.get("waiting") else ""
            where.append(f"{r} in {beat['phase']!r}{waiting} for {beat['phase_s']:.1f} s")
        return "ranks still running: " + ", ".join(where)
