"""What a user sees of a running sweep from Ray's own tools (a real local Ray): the rank actors'
repr names the sweep and the rank, each trial's remote calls carry its name, every seqpar series is
read back from the node's metrics endpoint with its tags (Ray drops a name it does not accept
without a word), the phase and iterations change while a trial runs, the driver publishes the
sweep's trial counts, `seqpar cluster status` shows the trial in flight; the shipped Grafana
dashboard asks only for series and tags that exist. (The driver's series and a sweep's name in the
repr: tests/platform/test_artifact_store.py, whose sweep runs anyway.)"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, Trial
from seqpar.platform import cluster, metrics

# the labels Ray's exporter adds to every series (a dashboard may filter on them)
RAY_LABELS = {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "instance", "job"}


def samples() -> list[metrics.Sample]:
    import ray

    return metrics.scrape(metrics.endpoints([n for n in ray.nodes() if n.get("Alive")]))


def test_the_grafana_dashboard_asks_only_for_exported_series_and_their_tags():
    dash = json.loads(metrics.GRAFANA_DASHBOARD.read_text())
    exported = {s.exported: s for s in metrics.SERIES.values()}
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    assert len(dash["panels"]) >= 6
    seen = set()
    for q in queries:
        names = set(re.findall(r"\bray_seqpar_\w+", q))
        assert names and names <= set(exported), (q, names - set(exported))
        seen |= names
        keys = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", q))
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", q):
            keys |= {k.strip() for k in group.split(",") if k.strip()}
        keys |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", q))
        for name in names:
            assert keys <= set(exported[name].tags) | RAY_LABELS, (q, name, keys)
    assert seen == set(exported), f"no panel for {set(exported) - seen}"


def _in_flight(status: dict, gang: str) -> str | None:
    return next((s["in_flight"] for s in status["sweeps"] if s["gang"] == gang), None)


def _settled(status: dict | None, gang: str) -> bool:
    """The status shows the trial in flight with every rank past its rendezvous (on a loaded host
    one rank measures while the other still meets its peers: sample again)."""
    if status is None or not _in_flight(status, gang):
        return False
    mine = next(s for s in status["sweeps"] if s["gang"] == gang)
    return {r["phase"] for r in mine["ranks"]} <= {"measure", None}


def slow_ring(seed: int) -> Case:
    return Case("ring", world=2, batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=8,
                dtype="float32", seed=seed, warmup=1, iters=40)


@pytest.mark.ray
def test_a_running_trial_shows_its_phase_and_iterations_and_every_series_reads_back(
        ray_runner, gang_id, seed):
    from ray.util.state import list_tasks

    # the shared gang of 2 (tests/platform/test_frozen_rank.py takes it over from here)
    # a label longer than a tag keeps (the hash must survive the cut), with a character Ray refuses
    label = f"{slow_ring(seed).label()} · dashboard test {seed}"
    gang, tag = gang_id, metrics.trial_tag(label, "0123456789ab")
    assert len(tag) > 48 and tag.endswith(" 0123456789ab")
    trial = Trial(slow_ring(seed), gang, links={"intra": LinkModel(latency_s=0.05)})
    ray_runner.pool.evict()  # a gang of its own: a reused one would name the sweep that started it
    out: dict[str, object] = {}
    thread = threading.Thread(target=lambda: out.update(r=ray_runner.run(trial, tag=tag)))
    thread.start()
    iterations: dict[str, set[float]] = {"0": set(), "1": set()}
    measuring, status = set(), None
    try:
        while thread.is_alive():
            for x in samples():
                if x.tags.get("trial") != tag:
                    continue
                if x.name == "ray_seqpar_trial_iterations":
                    iterations[x.tags["rank"]].add(x.value)
                if x.name == "ray_seqpar_rank_phase" and x.value == 1:
                    if x.tags["phase"] == "measure":
                        measuring.add(x.tags["rank"])
            if measuring and not _settled(status, gang):
                status = cluster.status()
            time.sleep(0.5)
    finally:
        thread.join()
    assert out["r"].ok, out["r"].cause
    # live: at least two values of the iterations while the trial ran, both ranks seen measuring
    assert all(len({v for v in vals if 0 < v < 41}) >= 2 for vals in iterations.values()), iterations
    assert measuring == {"0", "1"}
    # cluster status: the trial in flight, the ranks' phases (a sweep's name: the artifact test)
    mine = next(s for s in status["sweeps"] if s["gang"] == gang)
    assert mine["in_flight"] == tag and mine["sweep"] == gang, mine
    assert {r["phase"] for r in mine["ranks"]} <= {"measure", None}
    # the repr names the gang (a sweep's: its name and id8) and the rank; the trial's remote
    # calls carry its name
    reprs = {a.name: a.repr_name for a in cluster.seqpar_actors(detail=True)}
    for r in range(2):
        assert reprs[cluster.actor_name(gang, r)] == f"RankWorker(sweep={gang}, rank={r}/2)"
    deadline = time.monotonic() + 15  # Ray's task events reach the state API in batches
    while True:
        tasks = list_tasks(address=cluster._state_address(), filters=[("name", "=", tag)],
                           raise_on_missing_output=False)
        if len(tasks) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {t.func_or_class_name for t in tasks} == {"RankWorker.run_trial"} and len(tasks) == 2
    # after it: every rank series of this trial, read back with its tags, its phases zeroed
    deadline = time.monotonic() + 15
    wanted = {s.exported for s in metrics.SERIES.values() if "trial" in s.tags}
    while True:
        mine = [x for x in samples() if x.tags.get("trial") == tag]
        names = {x.name for x in mine}
        phases = {(x.tags["rank"], x.tags["phase"]): x.value for x in mine
                  if x.name == "ray_seqpar_rank_phase"}
        if names >= wanted and len(phases) == 2 * len(metrics.PHASES) and not any(
                phases.values()):
            break
        assert time.monotonic() < deadline, f"not exported: {wanted - names}; phases {phases}"
        time.sleep(0.5)
    for x in mine:
        series = next(s for s in metrics.SERIES.values() if s.exported == x.name)
        assert set(series.tags) <= set(x.tags), (x.name, x.tags)
        assert x.tags["sweep"] == gang and x.tags["rank"] in ("0", "1")


def test_trial_tags_are_ascii_short_and_keep_the_hash():
    tag = metrics.trial_tag("ulysses P=4 zigzag causal · docs=3 N=4096 H=8/8 bfloat16 ×2 é", "ab12")
    assert tag.isascii() and tag.endswith(" ab12") and len(tag) <= 48 + 5
    assert metrics.sweep_tag("sweep-1a2b3c4d") == "1a2b3c4d" and metrics.sweep_tag("mine") == "mine"


def test_the_trial_in_flight_is_read_from_the_phases_until_the_state_api_lists_its_task():
    from types import SimpleNamespace

    from seqpar.platform.dashboard import sweep_progress

    actors = [SimpleNamespace(name=f"seqpar:sweep-1a2b3c4d:rank-{r}", actor_id=f"a{r}",
                              repr_name=f"RankWorker(sweep=demo 1a2b3c4d, rank={r}/2)")
              for r in range(2)]
    tags = {"sweep": "1a2b3c4d", "trial": "ring P=2 ab12"}
    samples = [metrics.Sample("ray_seqpar_rank_phase", {**tags, "rank": "0", "phase": "warmup"}, 0),
               metrics.Sample("ray_seqpar_rank_phase", {**tags, "rank": "0", "phase": "measure"}, 1),
               metrics.Sample("ray_seqpar_trial_iterations", {**tags, "rank": "0"}, 7),
               metrics.Sample("ray_seqpar_rank_phase",
                              {**tags, "trial": metrics.NO_TRIAL, "rank": "1", "phase": "idle"}, 1)]
    # the state API has not listed the ranks' task yet: the phases name the trial
    (lagging,) = sweep_progress(actors, {}, samples)
    assert lagging["name"] == "demo" and lagging["in_flight"] == "ring P=2 ab12"
    assert lagging["ranks"][0]["phase"] == "measure" and lagging["ranks"][0]["iterations"] == 7
    # once listed, the task's name is the answer; between trials nothing is in flight
    (listed,) = sweep_progress(actors, {"a0": "ulysses P=2 cd34", "a1": "ulysses P=2 cd34"},
                               samples)
    assert listed["in_flight"] == "ulysses P=2 cd34" and listed["ranks"][0]["phase"] is None
    (idle,) = sweep_progress(actors, {}, samples[3:])
    assert idle["in_flight"] is None
