"""The sequence-parallel model equals the one-process model in float64: loss within 1e-10 and every
parameter gradient within 1e-8 (relative to the gradient's largest entry), on every rank.

Matrix: every algorithm x P in {2, 4} x model states (replicated, FSDP2-sharded over the group)
under `make test-full`; `make test` runs each algorithm once at P = 4 (where every algorithm's
options do their non-trivial thing), in FSDP for two of them, replicated for the rest; inside
each, three of the five checkpoint modes, one in each layout, the modes rotating over the
algorithms (over the seven every layout meets every mode; `make test-full`: each algorithm the
cross product layout x checkpoint mode, 3 x 5 = 15 runs), with MHA and GQA and the fused head on
and off in each algorithm (`matrix`).
DP=2 x SP=2 for ring, ulysses and usp in every layout, in both states modes (FSDP over all four
ranks). Gradients are read with `net.full_grads()`, the same call in every mode. The reference
is computed in the test process (no group).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from seqpar import algorithms
from seqpar.algorithms import recording
from seqpar.experiments.spec import ExperimentSpec
from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer
from seqpar.rules import masks
from tests.resources import FULL

LAYOUTS = ("contiguous", "zigzag", "stripe")
ALGORITHMS = ("allgather", "ulysses", "ring", "usp", "double_ring", "wallfacer", "burst")
FSDP_COVERED = ("double_ring", "wallfacer")  # make test: FSDP at P = 4 for these, replicated else
N, BATCH, VOCAB = 16, 2, 61
CONFIGS = {"mha": ModelConfig(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=4, ffn=48),
           "gqa": ModelConfig(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)}
TILES = (5, 16)  # ragged token and vocabulary tiles for the fused head


def options_for(algorithm: str, world: int) -> dict:
    """Options that make each algorithm do its non-trivial thing at this P."""
    if algorithm == "usp":
        return {"dhp": 2}
    if algorithm == "wallfacer":
        return {"team_size": 2} if world == 4 else {}
    if algorithm == "double_ring":
        return {"inner_ring": 2} if world == 4 else {}
    if algorithm == "burst":
        return {"ranks_per_node": 2} if world == 4 else {}
    return {}


def tokens_for(seed: int, batch: int = BATCH) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, N + 1), generator=torch.Generator().manual_seed(seed))


RUNS_EACH = 3  # make test: runs an algorithm


def matrix(algorithm: str) -> list[tuple[str, str, str, bool]]:
    """(layout, checkpoint, heads kind, fused) of one algorithm x P's runs: the 15 of layout x
    checkpoint mode under SEQPAR_TEST_FULL, else three: run r = 3a + t (t = 0, 1, 2 of algorithm
    a) in mode r % 5 and layout r % 3 (each algorithm every layout; r = 0-14 meet every layout x
    mode pair), GQA where r // 2 is odd and the fused head where r is even (each algorithm both
    of each)."""
    if FULL:
        return [(layout, mode, "gqa" if (i + j) % 2 else "mha", (i + 2 * j) % 2 == 0)
                for i, layout in enumerate(LAYOUTS) for j, mode in enumerate(CHECKPOINT_MODES)]
    a = ALGORITHMS.index(algorithm)
    modes = len(CHECKPOINT_MODES)
    return [(LAYOUTS[r % len(LAYOUTS)], CHECKPOINT_MODES[r % modes],
             "gqa" if r // 2 % 2 else "mha", r % 2 == 0)
            for r in range(RUNS_EACH * a, RUNS_EACH * (a + 1))]


def test_the_runs_cover_every_layout_with_every_mode_heads_and_head():
    runs = [run for a in ALGORITHMS for run in matrix(a)]
    assert {(lay, mode) for lay, mode, _, _ in runs} == {
        (lay, mode) for lay in LAYOUTS for mode in CHECKPOINT_MODES}
    assert {mode for _, mode, kind, _ in runs if kind == "gqa"} == set(CHECKPOINT_MODES)
    for a in ALGORITHMS:  # each algorithm: every layout, both head kinds, the fused head on/off
        assert {r[0] for r in matrix(a)} == set(LAYOUTS)
        assert {r[2] for r in matrix(a)} == {"mha", "gqa"} and {r[3] for r in matrix(a)} == {
            True, False}


@functools.lru_cache(maxsize=64)
def reference(kind: str, fused: bool, seed: int, batch: int = BATCH):
    net = Transformer(CONFIGS[kind], checkpoint="none", fused_head=fused, seed=3,
                      dtype=torch.float64, head_tiles=TILES)
    loss = net.loss(tokens_for(seed, batch))
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in net.named_parameters()}


def _step(net: Transformer, tokens: torch.Tensor, cu_seqlens=None):
    """(loss, every full gradient) of one forward and backward."""
    loss = net.loss(tokens, cu_seqlens=cu_seqlens)
    loss.backward()
    return loss.item(), net.full_grads()


def _run(net: Transformer, tokens: torch.Tensor):
    with recording() as ledger:
        loss = net.loss(tokens)
        forward = ledger.total(phase="forward")
        loss.backward()
    return (loss.item(), net.full_grads(),
            {"forward": forward, "after": ledger.total(phase="forward"),
             "backward": ledger.total(phase="backward")})


def _sp_runs(env, algorithm: str, world: int, runs, seed: int, states: str):
    group = env.group(world)
    out = []
    for layout, mode, kind, fused in runs:
        net = Transformer(CONFIGS[kind], attention=algorithm, layout=layout, group=group,
                          checkpoint=mode, fused_head=fused, seed=3, dtype=torch.float64,
                          head_tiles=TILES, states=states, **options_for(algorithm, world))
        out.append(_run(net, tokens_for(seed)))
    return out


def check(label: str, got, want) -> None:
    loss, grads = got[0], got[1]
    ref_loss, ref_grads = want
    assert abs(loss - ref_loss) < 1e-10, f"{label}: loss {loss} vs {ref_loss}"
    for name, g in grads.items():
        err = ((g - ref_grads[name]).abs().max() / ref_grads[name].abs().max()).item()
        assert err < 1e-8, f"{label}: grad {name} relative error {err:.2e}"


def covered(algorithm: str, world: int, states: str) -> bool:
    """Whether `make test` runs this (algorithm, P, states): P = 4, where every algorithm's options
    do their non-trivial thing, in FSDP for the two whose attention runs on several groups at once
    (the DP x SP tests below run FSDP beside ring, ulysses and usp); all under SEQPAR_TEST_FULL."""
    return FULL or (world == 4 and (states == "fsdp") == (algorithm in FSDP_COVERED))


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "world", "states"), [
    (a, w, s) for a in ALGORITHMS for w in (2, 4) for s in ("replicated", "fsdp")
    if covered(a, w, s)])
def test_model_matches_one_process(gang, algorithm, world, states, seed):
    runs = matrix(algorithm)
    per_rank = gang.run(_sp_runs, algorithm, world, runs, seed, states, size=world)
    for i, (layout, mode, kind, fused) in enumerate(runs):
        want = reference(kind, fused, seed)
        for rank, results in enumerate(per_rank):
            check(f"{algorithm} P={world} {layout} {mode} {kind} fused={fused} rank {rank}",
                  results[i], want)
        # communication: the distributed attention's forward runs once per layer, except under
        # full checkpointing, whose backward replays it (booked as forward bytes during backward)
        for results in per_rank:
            bytes_ = results[i][2]
            replay = bytes_["after"] - bytes_["forward"]
            assert replay == (bytes_["forward"] if mode == "full" else 0), (mode, bytes_)


def _dp_sp_runs(env, runs, seed, states):
    """On the gang's DP x SP mesh (replica d on ranks {2d, 2d+1}, DP groups {0,2} and {1,3})."""
    replica = env.mesh.coord("dp")
    out = []
    for algorithm, layout, mode in runs:
        net = Transformer(CONFIGS["gqa"], attention=algorithm, layout=layout, mesh=env.mesh,
                          checkpoint=mode, seed=3, dtype=torch.float64, states=states,
                          **({"dhp": 2} if algorithm == "usp" else {}))
        # replica d trains on rows [2d, 2d + 2) of the 4-row batch the reference sees whole
        out.append(_run(net, tokens_for(seed, 2 * BATCH)[replica * BATCH:(replica + 1) * BATCH]))
    return out


@pytest.mark.multirank
@pytest.mark.parametrize(("algorithm", "states"), [  # each algorithm once, each states kind: make test
    ("ring", "replicated"), ("ulysses", "fsdp"), ("usp", "fsdp"),
    *(pytest.param(a, s, marks=pytest.mark.slow)
      for a, s in (("ring", "fsdp"), ("ulysses", "replicated"), ("usp", "replicated")))])
def test_dp2_x_sp2_matches_one_process(gang, seed, algorithm, states):
    """DP = 2 x SP = 2 on one mesh (algorithms' grid with a data-parallel axis): loss and every
    gradient equal the one-process model on the whole 4-row batch."""
    options = {"dhp": 2} if algorithm == "usp" else {}
    grid = algorithms.grid_for(algorithm, 2, **options).with_dp(2)
    key = (grid, (*algorithms.get(algorithm).axes, "dp"), None)
    first = ("ring", "ulysses", "usp").index(algorithm)  # so the modes rotate over algorithms
    runs = [(algorithm, layout, CHECKPOINT_MODES[(first + j) % len(CHECKPOINT_MODES)])
            for j, layout in enumerate(LAYOUTS)]
    per_rank = gang.run(_dp_sp_runs, runs, seed, states, size=4, mesh=key)
    for i, (alg, layout, mode) in enumerate(runs):
        want = reference("gqa", False, seed, 2 * BATCH)
        for rank, results in enumerate(per_rank):
            check(f"DP2xSP2 {alg} {layout} {mode} rank {rank}", results[i], want)


# the balanced layout deals packed documents by their relation (the attention's `positions`): a
# model that dealt them as one causal sequence got every loss and gradient wrong
DOC_LAYOUTS = (*LAYOUTS, "balanced")


def _doc_runs(env, algorithm: str, world: int, cu: tuple[int, ...], seed: int, states: str):
    out = []
    for layout in DOC_LAYOUTS:
        net = Transformer(CONFIGS["gqa"], attention=algorithm, layout=layout, group=env.group(world),
                          checkpoint="sc++", seed=3, dtype=torch.float64, states=states,
                          **options_for(algorithm, world))
        out.append(_step(net, tokens_for(seed), cu))
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("algorithm", ["ring", "ulysses", "usp"])
def test_packed_documents_match_one_process(gang, algorithm, seed):
    """Packed documents (text data): attention stays inside each document, on every layout."""
    cu = (0, 5, 12, N)
    net = Transformer(CONFIGS["gqa"], seed=3, dtype=torch.float64)
    want = _step(net, tokens_for(seed), cu)
    plain = Transformer(CONFIGS["gqa"], seed=3, dtype=torch.float64).loss(tokens_for(seed)).item()
    assert abs(plain - want[0]) > 1e-6, "documents changed nothing: the mask was not applied"
    states = "fsdp" if algorithm == "ring" else "replicated"
    for rank_results in gang.run(_doc_runs, algorithm, 2, cu, seed, states, size=2):
        for layout, got in zip(DOC_LAYOUTS, rank_results, strict=True):
            check(f"{algorithm} docs {layout}", got, want)


MASKS = ("block_sparse:4:0.5:2", "prefix_lm:6", "dilated:4:2", "window:5")


def _mask_runs(env, algorithm: str, world: int, seed: int, states: str):
    out = []
    for spec, layout in zip(MASKS, ("balanced", "stripe", "zigzag", "balanced"), strict=True):
        net = Transformer(CONFIGS["gqa"], attention=algorithm, layout=layout,
                          group=env.group(world), checkpoint="sc++", seed=3, dtype=torch.float64,
                          states=states, mask=masks.parse(spec, N),
                          **options_for(algorithm, world))
        out.append(_step(net, tokens_for(seed)))
    return out


@pytest.mark.multirank
@pytest.mark.parametrize("algorithm", ["ring", "usp", "burst"])
def test_any_mask_trains_as_one_process(gang, algorithm, seed):
    """The model under any mask (block-sparse, prefix-LM, dilated, a window) in the balanced,
    stripe and zigzag layouts: loss and every gradient equal the one-process model's."""
    wants = []
    for spec in MASKS:
        net = Transformer(CONFIGS["gqa"], seed=3, dtype=torch.float64, mask=masks.parse(spec, N))
        wants.append(_step(net, tokens_for(seed)))
    plain = Transformer(CONFIGS["gqa"], seed=3, dtype=torch.float64).loss(tokens_for(seed)).item()
    assert all(abs(plain - w[0]) > 1e-6 for w in wants), "a mask changed nothing"
    states = "fsdp" if algorithm == "ring" else "replicated"
    for rank_results in gang.run(_mask_runs, algorithm, 2, seed, states, size=2):
        for spec, got, want in zip(MASKS, rank_results, wants, strict=True):
            check(f"{algorithm} mask {spec}", got, want)


def _file_runs(env, cfg: ModelConfig, seed: int):
    net = Transformer(cfg, attention="ring", layout="zigzag", group=env.group(2),
                      checkpoint="sc++", seed=3, dtype=torch.float64, states="fsdp")
    return _run(net, tokens_for(seed))


@pytest.mark.multirank
def test_a_model_given_as_a_config_json_trains_as_one_process(gang, tmp_path, seed):
    """A sweep's `train.model: <config.json>` (a Hugging Face config) is the model the ranks build:
    ring over 2 FSDP ranks equals the one-process model made from the same file."""
    gqa = CONFIGS["gqa"]
    hf = {"model_type": "llama", "hidden_size": gqa.hidden, "vocab_size": gqa.vocab,
          "intermediate_size": gqa.ffn, "num_attention_heads": gqa.heads,
          "num_key_value_heads": gqa.kv_heads, "num_hidden_layers": gqa.layers,
          "rope_theta": 20000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    spec = {"model": {"heads": gqa.heads, "kv_heads": gqa.kv_heads, "head_dim": gqa.head_dim},
            "plan": {"algorithm": "ring", "world": 2, "layout": "zigzag"},
            "workload": {"seq_len": N, "dtype": "float64"}, "train": {"model": str(path)}}
    case = ExperimentSpec.parse(spec).to_case()
    cfg = case.config()
    assert cfg == dataclasses.replace(gqa, rope_theta=20000.0, norm_eps=1e-6), cfg
    net = Transformer(cfg, seed=3, dtype=torch.float64)
    want = _step(net, tokens_for(seed))
    for rank, got in enumerate(gang.run(_file_runs, cfg, seed, size=2)):
        check(f"config.json rank {rank}", got, want)
