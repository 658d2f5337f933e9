"""One rank grid serves every algorithm: the mesh's groups are the papers' groups (LoongTrain's HP/CP
groups and placements, the double ring's inner/outer rings, WallFacer's teams and sub-rings, burst's
node rings), and the gather plan needs O(1) kernel calls per shard pair in every layout."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms import burst, tokens
from seqpar.algorithms.comm import Comm, LinkModel
from seqpar.algorithms.mesh import Grid, Mesh
from seqpar.errors import ConfigError
from seqpar.rules import groups


def _sorted_groups(groups_):
    return sorted(tuple(g) for g in groups_)


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("placement", groups.PLACEMENTS)
def test_usp_grid_groups_are_loongtrains_hp_and_cp_groups(world, placement):
    for dhp in groups_divisors(world):
        dcp = world // dhp
        grid = algorithms.grid_for("usp", world, dhp=dhp, placement=placement)
        assert [list(g) for g in grid.groups("hp")] == groups.usp_hp_groups(dhp, dcp, placement)
        assert [list(g) for g in grid.groups("cp")] == groups.usp_cp_groups(dhp, dcp, placement)
        for rank in range(world):
            a, b = groups.usp_coords(rank, dhp, dcp, placement)
            assert (grid.coord("hp", rank), grid.coord("cp", rank)) == (a, b)


def groups_divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("inner", [1, 2, 4, 8])
def test_double_ring_grid_inner_and_outer_rings_are_alg2s(inner):
    grid = algorithms.grid_for("double_ring", 8, inner_ring=inner)
    assert [list(g) for g in grid.groups("inner")] == groups.inner_rings(8, inner)
    assert _sorted_groups(grid.groups("outer")) == _sorted_groups(groups.outer_rings(8, inner))
    for pos in range(8):  # the schedule's positions are the grid's coordinates
        ring = groups.NestedRing(8, inner, pos)
        i, t = divmod(pos, inner)
        assert (grid.coord("outer", pos), grid.coord("inner", pos)) == (i, t)
        assert ring.next_inner == grid.group_of("inner", pos)[(t + 1) % inner]


@pytest.mark.parametrize(("world", "c"), [(4, 1), (4, 2), (8, 1), (8, 2), (16, 2), (16, 4)])
@pytest.mark.parametrize("placement", groups.WALLFACER_PLACEMENTS)
def test_wallfacer_grid_teams_and_subrings_are_alg2_and_alg3s(world, c, placement):
    grid = algorithms.grid_for("wallfacer", world, team_size=c, placement=placement)
    wf = groups.WallFacerGrid(world, c, placement)
    assert [list(g) for g in grid.groups("team")] == [wf.members(t) for t in range(world // c)]
    for rank in range(world):
        assert list(grid.group_of("subring", rank)) == wf.subring(rank)
        assert list(grid.group_of("team", rank)) == wf.team(rank)


def test_burst_grid_puts_one_inner_ring_on_each_node():
    nodes = [0, 0, 0, 0, 1, 1, 1, 1]
    grid = algorithms.grid_for("burst", 8, nodes)
    assert [list(g) for g in grid.groups("inner")] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(g) for g in grid.groups("outer")] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for rank in range(8):
        assert groups.burst_ring(nodes, rank).inner == 4
    assert algorithms.grid_for("burst", 8, nodes, ranks_per_node=2).axis_size("inner") == 2
    assert algorithms.grid_for("burst", 8, [0, 1] * 4) == Grid.line(8)  # not blocks: flat ring


def test_grid_axis_groups_follow_picotrons_arange_view():
    grid = Grid((("a", 2), ("b", 3), ("c", 2)), (("bc", ("b", "c")),))
    cube = torch.arange(12).view(2, 3, 2)
    assert [list(g) for g in grid.groups("a")] == cube.permute(1, 2, 0).reshape(-1, 2).tolist()
    assert [list(g) for g in grid.groups("bc")] == cube.reshape(2, 6).tolist()
    assert grid.groups("sp") == (tuple(range(12)),)
    with pytest.raises(ConfigError, match="dim names must be distinct"):
        Grid((("a", 2), ("a", 2)))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "stripe"])
def test_gather_plan_needs_o1_calls_per_shard_pair(layout):
    """Stripe's sorted union would be O(s) one-row calls; the plan keeps member order instead."""
    world, n = 4, 4096
    for holders in ((tuple(range(world)),),                     # ulysses
                    ((0, 1), (2, 3)),                           # usp head-first HP groups / teams
                    (*((r,) for r in range(world)), tuple(range(world)))):  # allgather
        plan = tokens.gather_plan(layout, world, n, holders, True)
        for qi in range(len(holders)):
            for ki in range(len(holders)):
                calls = len(plan.tasks(qi, ki))
                assert calls <= 3 * len(holders[qi]) * len(holders[ki]), (holders, qi, ki, calls)


def test_gather_plan_is_exact_against_a_dense_mask():
    """Every (query, key) pair the plan's calls cover is exactly the causal mask on positions."""
    world, n = 4, 64
    for layout in ("contiguous", "zigzag", "stripe"):
        holders = ((0, 2), (1, 3))
        plan = tokens.gather_plan(layout, world, n, holders, True)
        for qi in range(2):
            for ki in range(2):
                qp, kp = plan.positions(qi), plan.positions(ki)
                covered = torch.zeros(len(qp), len(kp), dtype=torch.int)
                for t in plan.tasks(qi, ki):
                    block = torch.ones(t.q1 - t.q0, t.k1 - t.k0, dtype=torch.int)
                    if t.mask == "causal":
                        block = block.tril()
                    elif t.mask == "shifted":
                        block = block.tril(-1)
                    covered[t.q0:t.q1, t.k0:t.k1] += block
                assert torch.equal(covered, (kp[None, :] <= qp[:, None]).int()), layout


def test_packed_segments_start_at_16_byte_boundaries():
    """Item 11: a float64 segment after an odd-sized bf16 one must still be 16-byte aligned."""
    parts = [torch.randn(3, dtype=torch.float32).to(torch.bfloat16), torch.randn(5, dtype=torch.float64),
             torch.randn(7, dtype=torch.float32)]
    buf, specs = burst.pack_bytes(parts)
    assert buf.numel() == burst.packed_size([t.numel() * t.element_size() for t in parts])
    out = burst.unpack_bytes(buf, specs)
    for got, want in zip(out, parts, strict=True):
        assert torch.equal(got, want)
        assert (got.data_ptr() - buf.data_ptr()) % burst.ALIGN == 0


def test_no_algorithm_repeats_the_autograd_shell():
    """One torch.autograd.Function (base._Shell) serves every softmax algorithm, and one more
    (latent._LatentShell) the same algorithms' calls that carry MLA's latent (their inputs are the
    latent and the up-projection, not K,V); LASP's linear-attention functions are an op of their
    own. No algorithm module adds a shell of its own."""
    root = pathlib.Path(algorithms.__file__).parent
    owners = []
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    "Function" in ast.unparse(b) for b in node.bases):
                owners.append((path.name, node.name))
    shells = sorted(o for o in owners if o[0] != "lasp.py")
    assert shells == [("base.py", "_Shell"), ("latent.py", "_LatentShell")]


def test_emulated_clock_waits_for_cuda_work_before_it_starts(monkeypatch):
    """On CUDA the emulated transfer starts when the data is ready, not at enqueue."""
    calls = []

    class _Stream:
        def synchronize(self):
            calls.append("sync")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())

    class _Cuda:
        is_cuda = True

    Comm.solo(links={"inter": LinkModel(0.0, 1e9)})._clock([_Cuda()])
    assert calls == ["sync"]
    Comm.solo()._clock([_Cuda()])  # no emulation: no sync on the hot path
    assert calls == ["sync"]


def test_links_are_the_comms_own_and_a_mesh_carries_them():
    """Link emulation is state passed where a Comm is made: two Comms in one process emulate
    different links, and a mesh given links hands them to every axis without touching the
    original mesh (re-entrant: nothing global to set and reset)."""
    slow = {"inter": LinkModel(0.0, 1e3)}
    a, b = Comm.solo("sp", links=slow), Comm.solo("sp")
    assert a.links == slow and b.links == {}
    mesh = Mesh(Grid.line(1), (0,), 0, None, {"sp": b})
    fast = mesh.with_links(slow)
    assert fast.comm("sp").links == slow and mesh.comm("sp").links == {}
    assert fast.comm("sp").label == "sp" and fast.grid == mesh.grid


def test_options_are_typed_and_say_field_value_rule():
    cls = algorithms.get("usp")
    assert cls.parse({"dhp": 2}).dhp == 2
    with pytest.raises(ConfigError, match=r"^dhp='2': must be a positive integer$"):
        cls.parse({"dhp": "2"})
    with pytest.raises(ConfigError, match=r"^option='team_size': usp takes "):
        cls.parse({"team_size": 2})
    with pytest.raises(ConfigError, match=r"^grad_dtype='fp8': must be one of accumulate, input$"):
        algorithms.get("ring").parse({"grad_dtype": "fp8"})
