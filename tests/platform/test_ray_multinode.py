"""Real Ray nodes: two raylets on this machine (ray.cluster_utils.Cluster), joined by address.

It runs in a subprocess, because a process holds one Ray connection and the session's is the
embedded `ray_runner`'s. The rank -> node map must come from the actors' real node ids, and closing
the runner must leave no actor or placement group on a cluster it joined.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent("""
    import json
    import socket
    import time

    import ray
    from ray.cluster_utils import Cluster
    from seqpar.platform import cluster as cluster_api
    from seqpar.case import Case
    from seqpar.workers.trial import TrialRunner

    with socket.socket() as s:  # 8265 may belong to another Ray on this machine
        s.bind(("127.0.0.1", 0))
        dashboard_port = s.getsockname()[1]
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "dashboard_port": dashboard_port})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        with TrialRunner(address=cluster.address, device="cpu") as runner:
            case = Case("ring", world=4, batch=1, seq_len=32, heads=2, kv_heads=2, head_dim=8,
                        dtype="float32", warmup=0, iters=2)
            r = runner.run(case, nodes=2, experiment_id="multinode")
        deadline = time.monotonic() + 15  # after close(): nothing of the gang may stay behind
        while (left := cluster_api.seqpar_actors() + cluster_api.seqpar_placement_groups()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        print(json.dumps({"status": r.status, "cause": r.cause, "topology": r.topology,
                          "node_of_rank": r.node_of_rank,
                          "node_ids": [m.extra["node_id"] for m in r.per_rank],
                          "metrics": r.metrics(), "left_after_close": len(left)}))
    finally:
        ray.shutdown()
        cluster.shutdown()
""")


def test_ranks_on_two_real_ray_nodes_get_the_real_topology():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["status"] == "FINISHED", out["cause"]
    assert out["topology"] == "real"
    ids = out["node_ids"]
    assert len(set(ids)) == 2 and ids[0] == ids[1] and ids[2] == ids[3]  # one PG per node
    assert out["node_of_rank"] == [0, 0, 1, 1]
    m = out["metrics"]
    assert m["bytes_inter"] == m["bytes_intra"] > 0  # ring: ranks 1 and 3 send across nodes
    assert out["left_after_close"] == 0
