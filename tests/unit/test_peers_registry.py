"""The peers without a process group: the listing, the refusal of a peer that cannot run here (one
line, before anything starts), their rules (through the adapters and on the torch-free floor the
planner reads, GPU-only peers included), the booking of their calls, and the adapters of the
GPU-only peers bound against the peers' own code as far as a CPU allows (argument names, groups,
layouts)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from seqpar import algorithms, peers
from seqpar.algorithms import layouts, ledger
from seqpar.algorithms.base import AttnShape
from seqpar.algorithms.comm import Comm
from seqpar.case import Case
from seqpar.cli import app as cli_app
from seqpar.cli import options
from seqpar.errors import ConfigError
from seqpar.peers.booking import Hook, booking, equal_alltoall_sends
from seqpar.rules import algorithms as rules
from seqpar.rules import peers as peer_rules

CPU_PEERS = {"peer:yunchang-ulysses": "yunchang", "peer:torch-cp-ring": None}
GPU_PEERS = {"peer:ring-flash-zigzag", "peer:ring-flash-llama3", "peer:yunchang-usp", "peer:te-cp",
             "peer:magi-attention"}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def source_function(module: str, path: str, name: str) -> ast.FunctionDef:
    """A function of an installed package, read from its source (the package may not import
    here: ring-flash-attention imports flash-attn)."""
    root = Path(importlib.util.find_spec(module).submodule_search_locations[0])
    tree = ast.parse((root / path).read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def parameters(fn: ast.FunctionDef) -> set[str]:
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs}


# ------------------------------------------------------------------------------- listing, refusal
def test_catalogue_lists_every_peer_and_why_the_gpu_ones_cannot_run_here():
    info = {p.name: p for p in peers.catalogue()}
    assert set(info) == set(CPU_PEERS) | GPU_PEERS
    for name, module in CPU_PEERS.items():
        assert (info[name].unavailable is None) == (module is None or installed(module))
    if not torch.cuda.is_available():
        for name in GPU_PEERS:
            why = info[name].unavailable
            assert why and "CUDA" in why and "\n" not in why


def test_studies_command_lists_the_peers_with_whether_they_run_here():
    result = CliRunner().invoke(cli_app.app, ["studies", "--peers", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["peer"]: r["runs here"] for r in json.loads(result.output)}
    assert rows["peer:torch-cp-ring"] == "yes"
    assert rows["peer:ring-flash-zigzag"].startswith("no: ") or torch.cuda.is_available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU peers may run on this machine")
def test_sweep_of_a_peer_that_cannot_run_here_is_one_line_exit_2_before_any_actor(
        monkeypatch, capsys, tmp_path):
    def forbidden(*args, **kwargs):
        raise AssertionError("the sweep reached Ray or MLflow")

    monkeypatch.setattr(options, "trial_runner", forbidden)
    monkeypatch.setattr(options, "tracker", forbidden)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(
        "base:\n  model: tiny\n  plan: {algorithm: peer:ring-flash-zigzag, world: 2}\n"
        "  workload: {seq_len: 256}\n  env: {device: cpu}\ngrid: {}\n")
    monkeypatch.setattr(sys, "argv", ["seqpar", "sweep", "s.yaml"])
    with pytest.raises(SystemExit) as info:
        cli_app.main()
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2
    assert "plan.algorithm='peer:ring-flash-zigzag'" in err and "cannot run here" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "mlflow.db").exists()


def test_unknown_peer_names_the_peers():
    with pytest.raises(ConfigError, match="peer:torch-cp-ring"):
        algorithms.get("peer:tree")


def test_peers_stay_out_of_seqpars_own_registry():
    assert not any(name.startswith("peer:") for name in algorithms.REGISTRY)


# ------------------------------------------------------------------------------------- rules
@pytest.mark.parametrize(("case", "field"), [
    (Case("peer:torch-cp-ring", 2, "stripe", True), "layout"),
    (Case("peer:torch-cp-ring", 2, "zigzag", True, options=(("rotate", "ring"),)), "rotate"),
    (Case("peer:yunchang-ulysses", 4, "zigzag", True, heads=8, kv_heads=4), "layout"),
    (Case("peer:yunchang-ulysses", 4, "contiguous", True, heads=8, kv_heads=2), "kv_heads"),
    (Case("peer:torch-cp-ring", 2, "zigzag", True, options=(("backend", "math"),)), "backend"),
    (Case("peer:torch-cp-ring", 2, "zigzag", True, seq_len=48, cu_seqlens=(0, 16, 48)),
     "documents"),
])
def test_a_peer_states_its_rules_as_config_errors(case, field):
    with pytest.raises(ConfigError) as info:
        case.validate()
    assert info.value.field == field


@pytest.mark.parametrize(("name", "world", "shape", "call", "field"), [
    ("peer:ring-flash-zigzag", 4, {}, {"layout": "zigzag", "causal": False}, "causal"),
    ("peer:ring-flash-zigzag", 4, {}, {"layout": "contiguous"}, "layout"),
    ("peer:ring-flash-llama3", 4, {}, {"heads_k_stride": 3}, "heads_k_stride"),
    ("peer:ring-flash-llama3", 4, {}, {"heads_k_stride": 0}, "heads_k_stride"),
    ("peer:yunchang-ulysses", 4, {"kv_heads": 2}, {}, "kv_heads"),
    ("peer:yunchang-usp", 8, {}, {"ulysses_degree": 3}, "ulysses_degree"),
    ("peer:yunchang-usp", 8, {"kv_heads": 2}, {"ulysses_degree": 4}, "ulysses_degree"),
    ("peer:te-cp", 4, {}, {"layout": "contiguous"}, "layout"),
    ("peer:te-cp", 4, {}, {"layout": "zigzag", "comm": "ring"}, "comm"),
    ("peer:te-cp", 4, {"heads": 6, "kv_heads": 2}, {"layout": "zigzag", "comm": "a2a"}, "comm"),
    ("peer:magi-attention", 4, {"head_dim": 256}, {}, "head_dim"),
    ("peer:torch-cp-ring", 4, {}, {"layout": "stripe"}, "layout"),
])
def test_the_rules_floor_states_every_peers_rules_without_the_peer(name, world, shape, call, field):
    """The planner's view (seqpar.rules, no torch, the peer need not run here) refuses what the
    adapter would, field by field (each peer's default call passes: the test below)."""
    dims = {"batch": 1, "seq_len": 64, "heads": 8, "kv_heads": 4, "head_dim": 64, "elem_bytes": 2}
    call = {"layout": "zigzag" if name in ("peer:ring-flash-zigzag", "peer:te-cp")
            else "contiguous", **call}
    with pytest.raises(ConfigError) as info:
        rules.check(name, AttnShape(**{**dims, **shape}), world, **call)
    assert info.value.field == field


@pytest.mark.parametrize("name", sorted(CPU_PEERS | dict.fromkeys(GPU_PEERS)))
def test_the_rules_floor_takes_each_peers_default_call(name):
    layout = "zigzag" if name in ("peer:ring-flash-zigzag", "peer:te-cp") else "contiguous"
    rules.check(name, AttnShape(1, 64, 8, 4, 64, 2), 4, layout)


def test_a_peer_refuses_a_window_when_built():
    with pytest.raises(ConfigError, match="window"):
        algorithms.build_attention("peer:torch-cp-ring", causal=True, window=4)


# ------------------------------------------------------------------------------------- booking
def test_booking_books_the_calls_on_the_groups_it_knows_and_restores_the_function():
    calls = []
    module = SimpleNamespace(all_to_all_single=lambda out, inp, group=None: calls.append(group))
    original = module.all_to_all_single
    comm = Comm.solo("sp")
    comm.size, comm.global_ranks = 4, [0, 1, 2, 3]
    mine, other = object(), object()
    hook = Hook(module, "all_to_all_single", "all_to_all", equal_alltoall_sends)
    send = torch.zeros(8, 3, dtype=torch.float64)
    with ledger.recording() as book, booking({mine: comm}, [hook]):
        module.all_to_all_single(torch.empty_like(send), send, group=mine)
        module.all_to_all_single(torch.empty_like(send), send, group=other)
    assert calls == [mine, other] and module.all_to_all_single is original
    assert book.total(op="all_to_all") == 3 * 2 * 3 * 8  # 3 other ranks, a quarter each


def test_booking_holds_a_call_for_its_emulated_link_time():
    from seqpar.algorithms import comm as comm_module

    module = SimpleNamespace(all_to_all_single=lambda out, inp, group=None: None)
    comm = Comm.solo("sp", links={"intra": comm_module.LinkModel(latency_s=0.05)})
    comm.size, comm.global_ranks = 2, [0, 1]
    hook = Hook(module, "all_to_all_single", "all_to_all", equal_alltoall_sends)
    send = torch.zeros(4, 4)
    with booking({"g": comm}, [hook]):
        start = time.perf_counter()
        module.all_to_all_single(torch.empty_like(send), send, group="g")
        held = time.perf_counter() - start
    assert held >= 0.05


# ------------------------------------------- GPU-only adapters, bound against the peers' own code
ring_flash = pytest.mark.skipif(not installed("ring_flash_attn"),
                                reason="ring-flash-attn not installed (pip install 'seqpar[peers]')")


@ring_flash
def test_ring_flash_adapters_call_the_functions_with_their_parameter_names():
    zigzag = parameters(source_function("ring_flash_attn", "zigzag_ring_flash_attn.py",
                                        "zigzag_ring_flash_attn_func"))
    assert {"q", "k", "v", "softmax_scale", "causal", "group"} <= zigzag
    llama3 = parameters(source_function("ring_flash_attn", "llama3_flash_attn_varlen.py",
                                        "llama3_flash_attn_varlen_func"))
    from seqpar.peers.ring_flash_attn import varlen_args

    bound = set(varlen_args(32, 0, 2, True, torch.device("cpu"), prepare=lambda *a: (0,) * 5))
    assert bound | {"q", "k", "v", "heads_k_stride", "softmax_scale", "causal", "group"} <= llama3


@ring_flash
@pytest.mark.parametrize("world", [2, 4])
def test_llama3_slices_are_the_contiguous_layout(world):
    """ring-flash-attention's own cu_seqlens preparation (run from its source) gives each rank the
    queries seqpar's contiguous layout deals it and the keys up to its last query."""
    fn = source_function("ring_flash_attn", "llama3_flash_attn_varlen.py",
                         "llama3_flash_attn_prepare_cu_seqlens")
    namespace = {"torch": torch}
    exec(compile(ast.Module([fn], []), "llama3_prepare", "exec"), namespace)
    from seqpar.peers.ring_flash_attn import varlen_args

    n = 8 * world
    for rank in range(world):
        args = varlen_args(n, rank, world, True, torch.device("cpu"),
                           prepare=namespace[fn.name])
        held = layouts.positions("contiguous", rank, world, n)
        assert args["cu_seqlens_q"].tolist() == [0, len(held)]
        assert args["local_k_slice"] == slice(0, max(held) + 1)


@pytest.mark.skipif(not installed("yunchang"), reason="yunchang not installed")
@pytest.mark.parametrize(("world", "degree"), [(4, 2), (8, 4), (8, 2)])
def test_yunchang_usp_groups_are_the_ones_yunchang_builds(monkeypatch, world, degree):
    """yunchang's set_seq_parallel_pg (use_ulysses_low) groups the ranks exactly as the adapter's
    grid does, so the mesh's groups are the ones yunchang would create."""
    from yunchang import globals as yg

    from seqpar.peers.yunchang_usp import YunchangUsp, yunchang_groups

    made = []
    monkeypatch.setattr(torch.distributed, "new_group", lambda ranks: made.append(tuple(ranks)))
    yg.set_seq_parallel_pg(degree, world // degree, 0, world, use_ulysses_low=True)
    grid = YunchangUsp.grid(world, YunchangUsp.parse({"ulysses_degree": degree}))
    assert set(made[:world // degree]) == set(grid.groups("hp"))
    assert set(made[world // degree:]) == set(grid.groups("cp"))
    before = yg.PROCESS_GROUP.ULYSSES_PG, yg.PROCESS_GROUP.RING_PG
    with yunchang_groups("u", "r"):
        assert (yg.PROCESS_GROUP.ULYSSES_PG, yg.PROCESS_GROUP.RING_PG) == ("u", "r")
    assert (yg.PROCESS_GROUP.ULYSSES_PG, yg.PROCESS_GROUP.RING_PG) == before


@pytest.mark.skipif(not installed("yunchang"), reason="yunchang not installed")
def test_yunchang_usp_module_takes_the_arguments_the_adapter_passes():
    from yunchang import LongContextAttention

    assert "ring_impl_type" in inspect.signature(LongContextAttention.__init__).parameters
    assert {"softmax_scale", "causal"} <= set(
        inspect.signature(LongContextAttention.forward).parameters)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_torch_cp_cuda_handlers_bind_to_torchs_signatures(dtype):
    """The CUDA branch calls torch's ring SDPA handlers (flash for half precision, memory-efficient
    otherwise) with arguments their signatures accept, and the forward's extras in the order the
    backward wants them."""
    from seqpar.peers.torch_cp_ring import _attention_module, _cuda_backward, _cuda_forward

    real = _attention_module()
    names = ("_scaled_dot_product_ring_flash_attention",
             "_scaled_dot_product_ring_efficient_attention",
             "_scaled_dot_product_ring_flash_attention_backward",
             "_scaled_dot_product_ring_efficient_attention_backward")

    def binder(name):
        def call(*args, **kwargs):
            inspect.signature(getattr(real, name)).bind(*args, **kwargs)
            return name, args, kwargs
        return call

    stub = SimpleNamespace(**{n: binder(n) for n in names})
    t = torch.zeros(1, 2, 4, 8, dtype=dtype)
    name, *_ = _cuda_forward(stub, "mesh", t, t, t, True, 0.5)
    flash = dtype == torch.bfloat16
    assert name == names[0 if flash else 1]
    rest = list(range(9 if flash else 2))
    name, args, kwargs = _cuda_backward(stub, "mesh", t, t, t, t, t, t, rest, True, 0.5)
    assert name == names[2 if flash else 3] and kwargs == {"scale": 0.5}


def test_te_arguments_are_named_as_dot_product_attention_takes_them():
    from seqpar.peers.transformer_engine import te_arguments

    args = te_arguments(8, 2, 64, True, None, "g", [0, 1], "s", "p2p")
    assert args["qkv_format"] == "bshd" and args["attn_mask_type"] == "causal"
    assert args["num_gqa_groups"] == 2 and args["cp_comm_type"] == "p2p"
    if installed("transformer_engine"):
        from transformer_engine.pytorch import DotProductAttention

        inspect.signature(DotProductAttention.__init__).bind(None, **args)


def test_magi_packing_round_trips_and_bounds_the_rows():
    from seqpar.peers.magi_attention import from_packed, row_bounds, to_packed

    t = torch.randn(3, 16, 2, 8)
    assert torch.equal(from_packed(to_packed(t), 3), t)
    assert row_bounds(3, 16, torch.device("cpu")).tolist() == [0, 16, 32, 48]


# ------------------------------------------------------------- the rules floor the planner reads
def test_every_adapter_is_its_rules_class_run():
    """One list of peers: every adapter subclasses the rules class `seqpar.rules.algorithms.get`
    answers for its name (the planner's), in the same order; seqpar.algorithms.get still answers
    the adapter where it runs."""
    assert [c.name for c in peers.PEER_CLASSES] == list(peer_rules.PEERS)
    for cls in peers.PEER_CLASSES:
        assert rules.get(cls.name) is peer_rules.PEERS[cls.name]
        assert issubclass(cls, rules.get(cls.name)) and cls.Options is rules.get(cls.name).Options
    for name, spec in algorithms.PEERS.items():
        if not isinstance(spec, str):
            assert algorithms.get(name) is spec and issubclass(spec, peer_rules.PEERS[name])
    assert not set(peer_rules.PEERS) & set(rules.REGISTRY)


def test_the_rules_floor_names_the_peers_for_an_unknown_peer():
    with pytest.raises(ConfigError, match="peer:yunchang-usp"):
        rules.get("peer:tree")


def test_the_peers_rules_answer_the_planner_without_importing_torch():
    code = ("import sys; from seqpar.rules import algorithms as a; "
            "from seqpar.rules.shape import AttnShape; s = AttnShape(1, 4096, 32, 8, 128, 2); "
            "a.check('peer:ring-flash-zigzag', s, 8, 'zigzag'); "
            "b = a.expected_bytes('peer:yunchang-usp', s, 8, layout='contiguous', ulysses_degree=4); "
            "g = a.grid_for('peer:yunchang-usp', 8, ulysses_degree=4); "
            "o = a.options_of('peer:torch-cp-ring'); "
            "print('torch' in sys.modules, b['forward'] > 0, g.groups('hp')[0], o['rotate'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "(0,", "1,", "2,", "3)", "allgather"]


@pytest.mark.parametrize("name", ["peer:te-cp", "peer:magi-attention"])
def test_a_peer_without_a_byte_model_says_so(name):
    with pytest.raises(NotImplementedError, match="no analytic byte count"):
        rules.expected_bytes(name, AttnShape(1, 64, 8, 8, 64, 2), 4)


@pytest.mark.parametrize(("peer", "options", "twin", "twin_options"), [
    ("peer:yunchang-ulysses", {}, "ulysses", {}),
    ("peer:torch-cp-ring", {"rotate": "alltoall"}, "ring", {}),
    ("peer:torch-cp-ring", {"grad_dtype": "input"}, "ring", {"grad_dtype": "input"}),
    ("peer:ring-flash-zigzag", {}, "ring", {}),
    ("peer:yunchang-usp", {"ulysses_degree": 2}, "usp", {"dhp": 2}),
    ("peer:yunchang-usp", {"ulysses_degree": 4, "use_ulysses_low": False}, "usp",
     {"dhp": 4, "placement": "context-first"}),
])
@pytest.mark.parametrize("world", [4, 8])
def test_peer_bytes_formulas_match_seqpars_where_the_schedule_is_the_same(
        peer, options, twin, twin_options, world, seed):
    """yunchang's Ulysses moves what seqpar's moves (K,V heads split, no replication); torch's and
    ring-flash-attention's rings a ring's (dK,dV accumulators in float32 for half precision);
    yunchang's USP seqpar's usp on the same grid."""
    rng = random.Random(seed)
    kv = world * rng.choice([1, 2])
    shape = AttnShape(rng.randint(1, 3), world * rng.randint(1, 64), kv * rng.choice([1, 2, 4]), kv,
                      rng.choice([16, 64, 128]), 2)
    got = rules.expected_bytes(peer, shape, world, **options)
    assert got == rules.expected_bytes(twin, shape, world, **twin_options)
    if peer == "peer:yunchang-usp":
        assert (rules.grid_for(peer, world, **options).groups("hp")
                == rules.grid_for(twin, world, **twin_options).groups("hp"))
