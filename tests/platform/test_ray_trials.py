"""Trials on a real local Ray: rank actors, gloo process groups, virtual topology, link emulation."""

from __future__ import annotations

import json

import pytest

from seqpar import algorithms
from seqpar.algorithms.comm import LinkModel
from seqpar.case import Case, Trial
from seqpar.errors import ConfigError, SeqparError
from seqpar.platform import cluster
from seqpar.workers.metrics import link_bytes

pytestmark = pytest.mark.ray


def ring_case(seed: int, **kw) -> Case:
    return Case("ring", world=4, layout="zigzag", batch=1, seq_len=32, heads=2, kv_heads=2,
                head_dim=8, dtype="float32", seed=seed, warmup=1, iters=3, **kw)


@pytest.mark.slow  # bytes by the real node map: tests/platform/test_two_nodes.py
def test_ring_on_virtual_2x2_books_each_ranks_bytes_on_its_next_neighbours_link(
        ray_runner, gang_id, seed):
    case = ring_case(seed)
    result = ray_runner.run(Trial(case, gang_id, nodes=2))
    assert result.status == "FINISHED", result.cause
    assert result.node_of_rank == [0, 0, 1, 1] and result.topology == "virtual"
    expected = algorithms.expected_bytes("ring", case.shape, 4)
    # every ring message goes to the next rank: intra from ranks 0 and 2, inter from 1 and 3
    for r, m in enumerate(result.per_rank):
        nxt = (r + 1) % 4
        link = "intra" if result.node_of_rank[r] == result.node_of_rank[nxt] else "inter"
        other = "inter" if link == "intra" else "intra"
        assert m.rank == r
        assert link_bytes(m, link) == expected["forward"] + expected["backward"]
        assert link_bytes(m, other) == 0
    metrics = result.metrics
    per_rank_total = expected["forward"] + expected["backward"]
    assert metrics["bytes_intra"] == metrics["bytes_inter"] == 2 * per_rank_total
    assert metrics["bytes_forward_p2p_inter"] == expected["forward"]
    assert metrics["step_ms"] > 0 and metrics["tokens_per_s"] > 0 and metrics["attn_tflops"] > 0
    json.dumps(result.to_dict(), allow_nan=False)


def test_gang_is_reused_and_its_actors_are_named_by_gang_and_rank(
        ray_runner, gang_id, seed):
    import ray

    first = ray_runner.run(Trial(ring_case(seed), gang_id))
    second = ray_runner.run(Trial(ring_case(seed + 1), gang_id, nodes=4))
    assert first.status == second.status == "FINISHED", (first.cause, second.cause)
    assert second.gang_reused and second.node_of_rank == [0, 1, 2, 3]
    pids = {m.extra["pid"] for m in first.per_rank}
    assert pids == {m.extra["pid"] for m in second.per_rank}  # the same four processes
    for r in range(4):
        actor = ray.get_actor(cluster.actor_name(gang_id, r), namespace=cluster.NAMESPACE)
        assert ray.get(actor.heartbeat.remote())["phase"] == "idle"


def test_inter_node_link_emulation_makes_the_ring_slower_on_2x2_than_on_1x4(
        ray_runner, gang_id, seed):
    """Latency and bandwidth: a K,V (or dK,dV) message takes 10 ms + 10 ms on the inter-node link.
    The ring waits for its slowest link: 3 forward steps, and 4 backward ones in which the K,V and
    gradient messages travel at once; a schedule that sent them one after the other would need 3 +
    3 + 4 = 10 messages' time, which the upper bound rules out."""
    case = ring_case(seed)
    kv_bytes = 2 * case.kv_heads * case.shape.unit(4)
    link = LinkModel(latency_s=0.01, bandwidth_bytes_per_s=kv_bytes / 0.01)
    message_ms = 1e3 * link.seconds(kv_bytes)
    links = {"inter": link}
    flat = ray_runner.run(Trial(case, gang_id, nodes=1, links=links))
    split = ray_runner.run(Trial(case, gang_id, nodes=2, links=links))
    assert flat.status == split.status == "FINISHED", (flat.cause, split.cause)
    assert split.to_dict()["placement"]["link_emulation"] == {
        "inter": {"latency_s": 0.01, "bandwidth_bytes_per_s": kv_bytes / 0.01}}
    unlimited = ray_runner.run(Trial(case, gang_id, nodes=2, links={"inter": LinkModel(0.02)}))
    placement = json.loads(json.dumps(unlimited.to_dict(), allow_nan=False))["placement"]
    assert placement["link_emulation"] == {
        "inter": {"latency_s": 0.02, "bandwidth_bytes_per_s": None}}
    slow, fast = split.metrics["step_ms"], flat.metrics["step_ms"]
    assert message_ms == pytest.approx(20.0)
    assert slow >= 7 * message_ms * 0.95              # overlapped: 3 + 4 messages on the path
    # serialised: 10 messages beside the compute (the 1x4 step's, whose messages are free): ruled
    # out, however slow a loaded host makes the compute
    assert slow <= 0.9 * 10 * message_ms + fast, (slow, fast)
    assert slow > 1.5 * fast, (slow, fast)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"nodes": 3}, "nodes"),
    ({"nodes": 2, "ranks_per_node": 3}, "ranks_per_node"),
    ({"links": {"wan": LinkModel(0.1)}}, "link_emulation"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_plans_raise_before_any_actor_starts(ray_runner, kwargs, field):
    with pytest.raises(ConfigError) as info:
        ray_runner.run(Trial(ring_case(0), "never-started", **kwargs))
    assert info.value.field == field
    assert not [a for a in cluster.seqpar_actors() if "never-started" in a.name]


def test_unknown_algorithm_option_raises_seqpar_error(ray_runner):
    case = Case("ring", world=4, options=(("no_such_option", 1),))
    with pytest.raises(SeqparError, match="no_such_option"):
        ray_runner.run(Trial(case, "never-started"))


def test_cluster_status_lists_the_node_and_the_idle_gang(ray_runner, gang_id, seed):
    import typer
    from typer.testing import CliRunner

    from seqpar.cli import cluster as cluster_cli

    assert ray_runner.run(Trial(ring_case(seed), gang_id)).ok
    root = typer.Typer()
    root.add_typer(cluster_cli.app)
    out = CliRunner().invoke(root, ["cluster", "status", "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    assert info["nodes"][0]["cpus"] >= 1
    gang = next(g for g in info["gangs"] if g["gang"] == gang_id)
    assert gang["ranks"] == 4 and all(a.endswith(":ALIVE") for a in gang["actors"])


def test_ranks_export_dashboard_metrics_tagged_by_gang_algorithm_and_rank(
        ray_runner, gang_id, seed):
    import time
    import urllib.request

    import ray

    assert ray_runner.run(Trial(ring_case(seed), gang_id)).ok
    node = ray.nodes()[0]
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    wanted = {f'rank="{r}"' for r in range(4)}
    deadline = time.monotonic() + 30  # the metrics agent exports every few seconds
    while True:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        lines = [ln for ln in text.splitlines() if ln.startswith("ray_seqpar_step_ms{")
                 and f'gang="{gang_id}"' in ln and 'algorithm="ring"' in ln]
        if {tag for ln in lines for tag in wanted if tag in ln} == wanted:
            break
        assert time.monotonic() < deadline, f"no seqpar_step_ms for every rank at {url}"
        time.sleep(1)


def test_a_sweeps_env_vars_reach_every_rank_and_key_the_gang(ray_runner, gang_id):
    """`env.vars` of a sweep: every rank starts with them (before its process group forms), and a
    gang started without them is not reused for a trial that has them."""
    case = Case("ring", 2, seq_len=16, iters=1, warmup=0)
    plain = ray_runner.run(Trial(case, gang_id))
    assert plain.ok, plain.cause
    assert all("NCCL_SOCKET_IFNAME" not in m.extra["comm_env"] for m in plain.per_rank)
    with_vars = ray_runner.run(Trial(case, gang_id, env_vars={"NCCL_SOCKET_IFNAME": "lo"}))
    assert with_vars.ok, with_vars.cause
    assert not with_vars.gang_reused
    assert [m.extra["comm_env"].get("NCCL_SOCKET_IFNAME") for m in with_vars.per_rank] == ["lo"] * 2
