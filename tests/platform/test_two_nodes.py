"""Two real Ray nodes on this machine (the session's `two_nodes` cluster), joined as a user would:
a sweep submitted as a Ray job, and a driver that joins by address. Each planned node's ranks on a
Ray node of their own, the bytes each rank sends split between intra- and inter-node exactly as the
real map says, burst's inner rings on the real nodes; a placement other than the plan refused with
both maps named; a rank that cannot import a module on its node a FAILED/startup trial, the next
trial fine; a communication variable set on the driver seen by every rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from seqpar import algorithms
from seqpar.algorithms import usp
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.burst import query_block_bytes
from tests.platform.conftest import HEAD_ONLY_MODULE, subprocess_env

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]  # `ray`, whichever venv runs the tests
JOB_ATTEMPTS = 3
SHAPE = {"heads": 4, "kv_heads": 4, "head_dim": 8}
SEQ_LEN = 32
PLANS = {  # label -> plan entry of the sweep: P = 4 on 2 nodes x 2 ranks
    "ring": {"algorithm": "ring"},
    "burst": {"algorithm": "burst"},
    "usp head-first": {"algorithm": "usp", "options": {"dhp": 2, "placement": "head-first"}},
    "usp context-first": {"algorithm": "usp", "options": {"dhp": 2, "placement": "context-first"}},
}
SWEEP = {
    "name": "two-nodes",
    "base": {"model": SHAPE, "plan": {"world": 4, "nodes": 2, "layout": "contiguous"},
             # full attention: every block travels every step, no transfer is skipped
             "workload": {"seq_len": SEQ_LEN, "causal": False, "dtype": "float32", "warmup": 0,
                          "iters": 1},
             "env": {"device": "cpu"}},
    "grid": {"plan": list(PLANS.values())},
}


@pytest.fixture(scope="module")
def job(two_nodes, tmp_path_factory):
    """`ray job submit` of the sweep: the job's id, the command's outcome, the store."""
    work = tmp_path_factory.mktemp("job")
    (work / "two-nodes.yaml").write_text(json.dumps(SWEEP))  # JSON is YAML
    uri = f"sqlite:///{work}/mlflow.db"
    for attempt in range(JOB_ATTEMPTS):
        job_id = f"seqpar-two-nodes-{work.name}-{attempt}"
        proc = subprocess.run(
            [*RAY_CLI, "job", "submit", "--address", two_nodes.dashboard,
             "--submission-id", job_id, "--", str(BIN / "seqpar"), "--tracking-uri", uri, "sweep",
             str(work / "two-nodes.yaml")],
            env=subprocess_env(), capture_output=True, text=True, timeout=300)
        if "No available agent to submit job" not in proc.stderr:
            break
        time.sleep(2)  # the head's job agent registers a moment after the node is up
    return job_id, proc, uri


def _runs(uri: str, tmp_path: Path) -> dict[str, dict]:
    """Every trial the sweep logged: its label -> (status, per-rank detail)."""
    from seqpar.platform.tracking import KIND_TAG, Tracker

    tracker = Tracker(uri)
    exps = [e.experiment_id for e in tracker.client.search_experiments()]
    out = {}
    for run in tracker.client.search_runs(exps, f"tags.`{KIND_TAG}` = 'trial'"):
        detail = json.loads(tracker.download(run.info.run_id, "per_rank.json", tmp_path)
                            .read_text())
        out[run.info.run_name] = {"status": run.info.status, "detail": detail}
    return out


def _split(rank_record: dict) -> dict[tuple[str, str], int]:
    """(op, link) -> bytes one rank sent in one step."""
    out: dict[tuple[str, str], int] = {}
    for e in rank_record["ledger"]["entries"]:
        out[e["op"], e["link"]] = out.get((e["op"], e["link"]), 0) + e["bytes_sent"]
    return out


def _analytic(label: str, rank: int, node_of_rank: list[int]) -> dict[tuple[str, str], int]:
    """(op, link) -> the bytes rank `rank` sends in a step on this node map, by the algorithm's
    analytic count and where its schedule sends them."""
    plan = PLANS[label]
    options = plan.get("options", {})
    shape = AttnShape(1, SEQ_LEN, SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"],
                      elem_bytes=4)
    total = sum(algorithms.expected_bytes(plan["algorithm"], shape, 4, layout="contiguous",
                                          causal=False, rank=rank, **options).values())
    nodes = len(set(node_of_rank))
    if label == "ring":  # every message goes to the next rank on the ring
        crosses = node_of_rank[rank] != node_of_rank[(rank + 1) % 4]
        return {("p2p", "inter" if crosses else "intra"): total}
    if label == "burst":  # one inner ring per node; one K,V and one query block per rank cross
        kv = 2 * shape.kv_heads * shape.unit(4)
        block, dq = query_block_bytes(shape, 4)
        inter = (nodes - 1) * (kv + block) + nodes * dq  # dq also crosses on its way home
        assert total == 3 * kv + 3 * block + 4 * dq
        return {("p2p", "inter"): inter, ("p2p", "intra"): total - inter}
    # usp: head-first keeps the head-parallel all-to-all inside a node and runs the context ring
    # across nodes; context-first the other way round
    by_op = usp.bytes_by_op(shape, 4, algorithms.get("usp").parse(options), rank)
    ring_link, a2a_link = (("inter", "intra") if options["placement"] == "head-first"
                           else ("intra", "inter"))
    want = {("all_to_all", a2a_link): sum(ops["all_to_all"] for ops in by_op.values()),
            ("p2p", ring_link): sum(ops["p2p"] for ops in by_op.values())}
    assert sum(want.values()) == total
    return want


@pytest.mark.slow
def test_ray_job_submit_runs_a_two_node_sweep_into_mlflow(job, two_nodes, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    job_id, proc, uri = job
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = JobSubmissionClient(two_nodes.dashboard)
    logs = client.get_job_logs(job_id)
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, logs[-3000:]
    assert f"{len(PLANS)} run, 0 failed" in logs, logs[-3000:]
    runs = _runs(uri, tmp_path)
    assert len(runs) == len(PLANS) and {r["status"] for r in runs.values()} == {"FINISHED"}


@pytest.mark.slow
def test_each_planned_node_is_a_ray_node_and_bytes_split_by_the_real_map(job, tmp_path):
    runs = _runs(job[2], tmp_path)
    assert len(runs) == len(PLANS)
    for name, run in runs.items():
        d = run["detail"]
        case = d["case"]
        label = next(k for k, p in PLANS.items() if p["algorithm"] == case["algorithm"]
                     and p.get("options", {}).items() <= case["options"].items())
        ids = [m["extra"]["node_id"] for m in d["per_rank"]]
        assert d["topology"] == "real" and d["node_of_rank"] == [0, 0, 1, 1], name
        assert ids[0] == ids[1] != ids[2] == ids[3], name  # each rank block on its own Ray node
        for rank, m in enumerate(d["per_rank"]):
            assert _split(m) == _analytic(label, rank, d["node_of_rank"]), (name, rank)


DRIVER = textwrap.dedent("""
    import json, os, sys
    import ray
    from seqpar.case import Case, Trial
    from seqpar.platform import cluster
    from seqpar.workers import trial

    gcs, module = sys.argv[1], sys.argv[2]
    os.environ["NCCL_SOCKET_IFNAME"] = "seqpar-probe0"  # set on the driver only

    class NeedsAModule(trial.RankWorker):  # a rank that imports what only the head node has
        def __init__(self, **kwargs):
            __import__(module)
            super().__init__(**kwargs)

    def case(seed):
        return Trial(Case("ring", world=4, batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=8,
                          dtype="float32", warmup=0, iters=1, seed=seed), "two-nodes", nodes=2)

    def outcome(r):
        return {"status": r.status, "cause": r.cause, "node_of_rank": r.node_of_rank,
                "failure": r.failure.value if r.failure else None}

    out = {}
    with trial.TrialRunner(address=gcs, device="cpu") as runner:
        out["head"] = next(n["NodeID"] for n in ray.nodes()
                           if "node:__internal_head__" in n["Resources"])
        worker, trial.RankWorker = trial.RankWorker, NeedsAModule
        out["missing"] = outcome(runner.run(case(1)))
        trial.RankWorker = worker
        r = runner.run(case(2))
        out["next"] = outcome(r)
        out["seen"] = [m.extra["comm_env"].get("NCCL_SOCKET_IFNAME") for m in r.per_rank]
        runner.pool.evict()  # a fresh gang, placed rank by rank across the two nodes
        bundle_of, cluster.bundle_of = cluster.bundle_of, lambda rank, rpn: rank % 2
        out["interleaved"] = outcome(runner.run(case(3)))
        cluster.bundle_of = bundle_of
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def driven(two_nodes):
    """A driver joined by address: one trial per scenario, as JSON."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, two_nodes.gcs, HEAD_ONLY_MODULE],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.slow
def test_a_rank_missing_a_module_on_its_node_fails_the_trial_at_startup_and_the_next_runs(driven):
    missing = driven["missing"]
    assert (missing["status"], missing["failure"]) == ("FAILED", "startup"), missing
    assert f"No module named '{HEAD_ONLY_MODULE}'" in missing["cause"], missing["cause"]
    named = missing["cause"].split(" could not start on node ", 1)[1].split(")")[0]
    assert named.split("(")[1] != driven["head"][:8]  # the node without the module
    assert driven["next"]["status"] == "FINISHED", driven["next"]["cause"]
    assert driven["next"]["node_of_rank"] == [0, 0, 1, 1]


@pytest.mark.slow
def test_a_communication_variable_set_on_the_driver_reaches_every_rank(driven):
    assert driven["seen"] == ["seqpar-probe0"] * 4


@pytest.mark.slow
def test_a_placement_other_than_the_plan_is_refused_naming_both_maps(driven):
    refused = driven["interleaved"]
    assert (refused["status"], refused["failure"]) == ("FAILED", "startup"), refused
    assert "planned rank->node map [0, 0, 1, 1], real [0, 1, 0, 1]" in refused["cause"]
