"""How to open the Ray dashboard of the cluster this process is connected to, and what a running
sweep looks like from outside it (`sweep_progress`: the state API and the metrics).

Ray >= 2.52 can require a token for the dashboard ("Authentication Token Required"); a local
`ray.init()` in Ray 2.60 turns token authentication on by default and keeps the token where
`ray get-auth-token` finds it: `$RAY_AUTH_TOKEN`, else the file `$RAY_AUTH_TOKEN_PATH`, else
`~/.ray/auth_token` (generated on first use). The dashboard's login page takes that token and keeps
it as a cookie; API clients send it as `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from seqpar.platform.metrics import NO_TRIAL, Sample, sweep_tag

DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"


def url() -> str | None:
    """The dashboard's address (http://host:port), or None without a dashboard."""
    try:
        import ray

        address = ray._private.worker.get_dashboard_url()  # the one place Ray exposes it
    except Exception:
        return None
    if not address:
        return None
    return address if address.startswith("http") else f"http://{address}"


def token_required() -> bool:
    """True when the connected cluster enforces token authentication."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode:
        return mode == "token"
    try:
        from ray._private.authentication import authentication_utils

        return bool(authentication_utils.is_token_auth_enabled())
    except Exception:
        return False


def token_source() -> str:
    """Where `ray get-auth-token` reads the token from, in Ray's order of precedence."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the environment variable RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file {os.environ['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
    return f"the file {DEFAULT_TOKEN_PATH}"


def read_token() -> str | None:
    """The token itself (for tests and tools that talk to the dashboard), if one is readable."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def how_to_look(actor_prefix: str) -> list[str]:
    """The lines a sweep prints when it starts: the address, how to get in, what to look for."""
    address = url()
    if address is None:
        return ["Ray dashboard: not running (SEQPAR_RAY_DASHBOARD=0 or a cluster without one)"]
    lines = [f"Ray dashboard: {address}/#/actors  (the ranks are actors named "
             f"{actor_prefix}<rank>)"]
    if token_required():
        lines.append(f"  it asks for a token: paste the output of `ray get-auth-token` "
                     f"(read from {token_source()})")
    return lines


PACE = {"ray_seqpar_sweep_trials_per_min": "per_min", "ray_seqpar_sweep_left_s": "left_s"}
REPR = re.compile(r"RankWorker\(sweep=(?P<sweep>.*), rank=(?P<rank>\d+)/(?P<world>\d+)\)")


def sweep_progress(actors: list[Any], running: dict[str, str], samples: list[Sample]
                   ) -> list[dict[str, Any]]:
    """Each sweep with rank actors alive: its name (the actors' repr), its trials done / failed /
    pending (the driver's `seqpar_sweep_trials`), its pace and time left (`per_min`, `left_s`:
    `seqpar_sweep_trials_per_min`, `seqpar_sweep_left_s`), the trial in flight (the name of the ranks'
    running task, or until Ray's state API lists it, the trial their phase series name) and each
    rank's phase and iterations (`seqpar_rank_phase`, `seqpar_trial_iterations`). A series not
    exported yet reads as None."""
    by_sweep: dict[str, dict[str, Any]] = {}
    for a in actors:
        gang, _, rank = (a.name or "").removeprefix("seqpar:").rpartition(":rank-")
        if not gang or not rank.isdigit():
            continue
        tag = sweep_tag(gang)
        match = REPR.fullmatch(a.repr_name or "")
        name = match["sweep"].removesuffix(tag).strip() if match else ""
        s = by_sweep.setdefault(tag, {"sweep": tag, "gang": gang, "name": name, "trials": None,
                                      "per_min": None, "left_s": None, "in_flight": None,
                                      "ranks": {}})
        s["name"] = s["name"] or name
        trial = running.get(a.actor_id)
        s["in_flight"] = s["in_flight"] or trial
        s["ranks"][int(rank)] = {"rank": int(rank), "phase": None, "iterations": None,
                                 "trial": trial}
    # Ray's state API lists a task as RUNNING a second or more after it starts (task events are
    # batched); the ranks' own phase series name the trial they run from its first phase
    for x in samples:
        s = by_sweep.get(x.tags.get("sweep", ""))
        if (s is not None and s["in_flight"] is None and x.name == "ray_seqpar_rank_phase"
                and x.value == 1 and x.tags.get("trial", NO_TRIAL) != NO_TRIAL):
            s["in_flight"] = x.tags["trial"]
    for x in samples:
        s = by_sweep.get(x.tags.get("sweep", ""))
        if s is None:
            continue
        if x.name == "ray_seqpar_sweep_trials":
            s["trials"] = {**(s["trials"] or {}), x.tags.get("status", "?"): int(x.value)}
            continue
        if x.name in PACE:
            s[PACE[x.name]] = x.value
            continue
        rank = s["ranks"].get(int(x.tags.get("rank", -1)))
        if rank is None or x.tags.get("trial") != (rank["trial"] or s["in_flight"] or NO_TRIAL):
            continue
        if x.name == "ray_seqpar_rank_phase" and x.value == 1:
            rank["phase"] = x.tags.get("phase")
        elif x.name == "ray_seqpar_trial_iterations":
            rank["iterations"] = int(x.value)
    return [{**s, "ranks": [s["ranks"][r] for r in sorted(s["ranks"])]}
            for _, s in sorted(by_sweep.items())]
