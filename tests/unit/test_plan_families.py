"""The planner prices each family as it is (issue 42): `model_params` against the published
totals, a sliding-window layer's attention priced as its window's, FLOPs of a mixture of experts
by its active parameters and its states, gathers and memory by all of them, a tied embedding held
once and its head still run, and a model whose experts need expert parallelism planned with it.

The published counts and their conventions (ours: `active` is the total minus the routed experts
a token is not sent to, embeddings in both):
- Qwen3-8B 8.19B (Qwen's model card: 8.2B); Qwen3-30B-A3B 30.5B / 3.3B (ours 30.53B / 3.35B: the
  card states one decimal, the checkpoint's tensors sum to our total exactly).
- Gemma-3-27B: Google's 27B is the language model's (ours 27.01B, the text_config's decoder with
  its tied 262,208 x 5,376 embedding); the published checkpoint adds the 0.4B SigLIP vision tower
  and projector (27.4B), which seqpar neither plans nor counts.
- gpt-oss-20b 20.9B / 3.6B and gpt-oss-120b 116.8B / 5.1B (OpenAI's model card): OpenAI's active
  count leaves the embedding table out (a lookup) but keeps the unembedding; ours keeps both, so
  ours less one vocab x hidden matrix (0.58B) is theirs.
- Mixtral-8x7B 46.7B / 12.9B (Mistral's: both embeddings in the active count, as ours).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from seqpar.errors import ConfigError
from seqpar.planner import clusters, host, plan
from seqpar.planner.api import predict
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.memory import gathered_bytes
from seqpar.planner.policy import Filters, Policy
from seqpar.planner.search import Result, make_setup, search
from seqpar.planner.step import step
from seqpar.rules import flops, masks
from seqpar.rules.counts import largest_layer_numel, layer_classes, model_params
from seqpar.rules.memory import ELEM, TrainPolicy, predicted_states
from seqpar.rules.model import ModelConfig, from_hf, load

RNG = random.Random()
H100 = clusters.load("h100-sxm")


def published(name: str) -> ModelConfig:
    """A preset: its config.json as published."""
    return load(name)


def all_full(cfg: ModelConfig) -> ModelConfig:
    return replace(cfg, layer_types=("full",) * cfg.layers)


@pytest.mark.parametrize(("name", "total", "active"), [
    ("qwen3-8b", 8.19e9, 8.19e9),
    ("gemma-3-27b", 27.0e9, 27.0e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("gpt-oss-20b", 20.91e9, 3.61e9),
    ("gpt-oss-120b", 116.83e9, 5.13e9),
    ("qwen3-30b-a3b", 30.53e9, 3.3e9),
])
def test_model_params_against_the_published_totals(name, total, active):
    cfg = published(name)
    got = model_params(cfg)
    assert got == {"total": cfg.params(), "active": cfg.active_params()}
    assert got["total"] == pytest.approx(total, rel=0.01)
    if name.startswith("gpt-oss"):  # OpenAI's active count leaves the embedding table out
        assert got["active"] - cfg.vocab * cfg.hidden == pytest.approx(active, rel=0.01)
    elif name == "qwen3-30b-a3b":  # Qwen's card: one decimal (ours 3.35B)
        assert abs(got["active"] - active) < 0.06e9
    else:
        assert got["active"] == pytest.approx(active, rel=0.01)


def test_the_plan_carries_model_params():
    cfg = published(RNG.choice(["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-8b"]))
    setup = make_setup(H100, cfg, 8192, None, 8, 1)
    want = {"total": cfg.params(), "active": cfg.active_params()}
    assert setup.model_params == Result(setup, [], []).model_params == want  # --scope model|cluster
    assert plan.model_params_of("mixtral-8x7b") == model_params(load("mixtral-8x7b"))  # attention
    assert plan.model_params_of("tiny-gqa") is None  # an attention shape names no decoder
    work = Workload.of("fixed:4096", tokens=2 ** 15, longest=4096, capacity=4096)
    assert LengthPlan.make(H100, cfg, work, 8, 1).model_params == want  # --lengths


def _step(cfg: ModelConfig, n: int, world: int, name: str = "ring", layout: str = "zigzag",
          policy: Policy = Policy("dp_sp", "full")):
    setup = make_setup(H100, cfg, n, n, world, max(1, world // 8))
    attn = setup.attention(world, name, {}, layout)
    return setup, step(setup, 1, world, attn, policy)


def test_a_sliding_layer_is_priced_as_its_window_at_long_sequences():
    cfg = published("gpt-oss-20b")  # 128-token windows on every other layer
    n, world = RNG.choice([(65536, 8), (131072, 16)])
    setup, mixed = _step(cfg, n, world)
    _, full = _step(all_full(cfg), n, world)
    by_kind = mixed.attention_kinds
    assert set(by_kind) == {"full", "sliding"} and set(full.attention_kinds) == {"full"}
    assert by_kind["full"] == pytest.approx(full.attention_kinds["full"], rel=1e-12)
    # the attention scope's prediction of the same configuration under the window's mask
    window = predict(host.bare(setup.cluster), "ring", setup.shape, world,
                     nodes=setup.sp_nodes(world), layout="zigzag",
                     mask=masks.sliding_window(n, cfg.window))
    assert by_kind["sliding"] == pytest.approx(window.attention_ms, rel=1e-12)
    assert by_kind["sliding"] < by_kind["full"] / 4  # a 128-token band, not N²/2 pairs
    # the step's attention: half the layers a window's; the rest of the step alike
    half = cfg.layers // 2
    assert mixed.parts["attention"] + mixed.parts["attention_comm"] == pytest.approx(
        half * (by_kind["full"] + by_kind["sliding"]), rel=1e-9)
    assert mixed.parts["other_compute"] == pytest.approx(full.parts["other_compute"], rel=1e-12)
    assert mixed.step_ms < full.step_ms
    # and its FLOPs: the band's pairs, not the causal triangle's
    band = masks.sliding_window(n, cfg.window).area
    assert flops.window_pairs(n, cfg.window) == band
    assert setup.pairs == pytest.approx((n * n / 2 + band) / 2, rel=1e-12)
    assert flops.model_pairs(cfg, n) == pytest.approx(setup.pairs, rel=1e-12)


def test_a_window_holding_the_sequence_is_a_full_layer():
    cfg = published("gemma-3-27b")  # 1,024-token windows
    setup = make_setup(H100, cfg, 1024, None, 8, 1)
    assert setup.sliding_mask is None and setup.pairs == 1024 * 1024 / 2


def test_sliding_layers_keep_documents_and_refuse_masks_without_a_window_form():
    cfg = published("gemma-3-27b")
    setup = make_setup(H100, cfg, 8192, None, 8, 1, mask="documents:4096,2048,2048")
    rel = setup.sliding_mask.relation
    assert (rel.cu, rel.window, rel.causal) == ((0, 4096, 6144, 8192), cfg.window, True)
    with pytest.raises(ConfigError, match="no sliding-window form"):
        make_setup(H100, cfg, 8192, None, 8, 1, mask="block_sparse:512:0.25")


def test_moe_flops_follow_the_active_parameters_and_states_all_of_them():
    cfg = published(RNG.choice(["mixtral-8x7b", "qwen3-30b-a3b"]))
    v_d = cfg.vocab * cfg.hidden
    assert flops.dense_params(cfg) == cfg.active_params() - v_d
    n = 4096
    attention = flops.step_flops(cfg, 1, n) - 6 * flops.dense_params(cfg) * n
    assert attention == pytest.approx(3 * cfg.layers * 4 * (n * n / 2) * cfg.heads * cfg.head_dim)
    # twice the experts at the same k: the same FLOPs but the router's, twice the states
    wide = replace(cfg, experts=2 * cfg.experts)
    router = cfg.layers * cfg.experts * cfg.hidden
    assert flops.dense_params(wide) - flops.dense_params(cfg) == router
    policy = TrainPolicy(states="fsdp", master_dtype="float32")
    s = predicted_states(cfg, "bfloat16", policy, 1)
    assert s["params"] == 4 * cfg.params()  # every expert's master weights
    assert predicted_states(wide, "bfloat16", policy, 1)["params"] > 1.5 * s["params"] - 4 * 2 * v_d
    # FSDP gathers a whole MoE block: every expert of it
    assert largest_layer_numel(cfg) > cfg.experts * 3 * cfg.moe_ffn * cfg.hidden


def test_a_step_of_moe_is_timed_by_its_active_experts_and_holds_all():
    cfg = published("mixtral-8x7b")
    dense = replace(cfg, experts=0, experts_per_tok=0, moe_ffn=0, moe_layers=())  # one expert
    n, world = 32768, 8
    _, moe = _step(cfg, n, world)
    _, one = _step(dense, n, world)
    # two experts a token: about twice the feed-forward's GEMMs of the one-expert decoder
    ffn, rest = 3 * cfg.ffn * cfg.hidden, 2 * cfg.hidden * (cfg.hidden + cfg.kv_heads * 128)
    ratio = (rest + 2 * ffn) / (rest + ffn)
    assert moe.parts["other_compute"] / one.parts["other_compute"] == pytest.approx(ratio, rel=0.1)
    # states and the gathered block by every parameter (8 experts)
    assert moe.memory["states"] / one.memory["states"] == pytest.approx(
        cfg.params() / dense.params(), rel=0.02)
    assert moe.memory["transient"] >= one.memory["transient"] + gathered_bytes(
        7 * ffn, "bfloat16", Policy("dp_sp").train("bfloat16"))


def test_a_tied_embedding_is_held_once_and_its_head_still_runs():
    cfg = published("qwen3-8b")
    tied = replace(cfg, tie_embeddings=True)
    v_d = cfg.vocab * cfg.hidden
    assert cfg.params() - tied.params() == v_d
    assert flops.dense_params(tied) == flops.dense_params(cfg)  # the head's matmul, either way
    policy = TrainPolicy(states="replicated", master_dtype="float32")
    assert predicted_states(cfg, "bfloat16", policy, 1)["params"] - predicted_states(
        tied, "bfloat16", policy, 1)["params"] == ELEM["float32"] * v_d


def test_head_dim_widens_q_and_o_beyond_hidden():
    cfg = published("gemma-3-27b")  # 32 heads x 128 = 4,096 against hidden 5,376
    assert cfg.heads * cfg.head_dim != cfg.hidden
    gemms = {c.kind: flops.block_params(cfg) for c in layer_classes(cfg)}
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    want = 2 * cfg.hidden * q + 2 * cfg.hidden * kv + 3 * cfg.hidden * cfg.ffn
    assert set(gemms.values()) == {want}
    assert flops.qkv_flops(cfg, 1) == 2 * cfg.hidden * (q + 2 * kv)


def test_experts_too_large_to_gather_are_planned_with_expert_parallelism():
    base = published("qwen3-30b-a3b")
    # 19.3B parameters a block: 155 GB gathered under FSDP; 4 blocks, 19 GB of states a rank
    big = replace(base, experts=4096, layers=4, layer_types=("full",) * 4, moe_layers=())
    with pytest.raises(ConfigError) as err:  # --ep 1 pinned: the one line
        make_setup(H100, big, 8192, None, 64, 8, ep=1)
    assert "needs expert parallelism (pinned to 1 here)" in str(err.value)
    assert "\n" not in str(err.value)
    found = search(make_setup(H100, big, 8192, None, 64, 8), Filters(sp=8), keep=1)
    assert found.fitting and found.fitting[0].policy.ep > 1  # searched: EP spreads the experts
    # gpt-oss-120b's experts gather on 64 H100s (3.2B a block): it is planned
    assert make_setup(H100, published("gpt-oss-120b"), 131072, None, 64, 8).cfg.experts == 128


def test_a_plan_of_lengths_refuses_the_model_s_windows_in_one_line():
    work = Workload.of("lognormal:mean=1024,sigma=1.5,min=128,max=8192", tokens=2 ** 16,
                       longest=8192, capacity=2048)
    with pytest.raises(ConfigError, match="sliding-window layers \\(window 1024\\) are planned at one"):
        LengthPlan.make(H100, published("gemma-3-27b"), work, 8, 1)
    assert LengthPlan.make(H100, published("mixtral-8x7b"), work, 8, 1).cfg.experts == 8


def _hf(name: str) -> ModelConfig:
    """transformers' default config of a family: the published model's (DeepSeek-V3,
    Qwen3-Next-80B-A3B)."""
    transformers = pytest.importorskip("transformers")
    return from_hf(json.loads(getattr(transformers, name)().to_json_string()))


@pytest.mark.parametrize(("name", "total", "active"), [
    ("DeepseekV3Config", 671.03e9, 37.55e9),   # DeepSeek's card: 671B, 37B activated
    ("Qwen3NextConfig", 79.67e9, 3.875e9),     # Qwen's card: 80B, 3B activated (3.9B with embeddings)
])
def test_model_params_of_mla_and_linear_families(name, total, active):
    got = model_params(_hf(name))
    assert got["total"] == pytest.approx(total, rel=1e-3)
    assert got["active"] == pytest.approx(active, rel=1e-3)


def test_mla_is_priced_latent_beside_kv_and_the_json_says_which():
    cfg = replace(_hf("DeepseekV3Config"), experts=8, experts_per_tok=2, layers=4,
                  layer_types=("full",) * 4, moe_layers=(3,))  # its attention, a small MoE
    setup = make_setup(H100, cfg, 131072, None, 64, 8)
    assert (setup.shape.head_dim, setup.shape.v_dim, setup.shape.kv_heads) == (192, 128, 128)
    kv = setup.attention(64, "ring", {}, "zigzag")
    latent = setup.latent(64, kv)
    assert (kv.mla_pass, latent.mla_pass) == ("kv", "latent")
    r = (512 + 64) / (128 * (192 + 128))  # the latent's values a token over K,V's
    assert latent.bytes_inter + latent.bytes_intra == pytest.approx(
        r * (kv.bytes_inter + kv.bytes_intra), rel=0.05)
    assert latent.compute_ms > kv.compute_ms  # the rebuild of every arriving shard's K,V
    assert setup.latent(64, setup.attention(64, "ulysses", {}, "zigzag")) is None
    s = step(setup, 1, 64, latent, Policy("dp_sp", "full"))
    assert s.json()["mla_pass"] == "latent"
    best = search(setup, keep=2).fitting
    assert {x.json()["mla_pass"] for x in best} <= {"kv", "latent"}


def test_a_linear_hybrid_is_priced_per_layer_class():
    cfg = _hf("Qwen3NextConfig")
    assert [(c.kind, c.count) for c in layer_classes(cfg)] == [("linear", 36), ("full", 12)]
    setup = make_setup(H100, cfg, 262144, None, 64, 8)
    lin = setup.linear(64)
    assert lin.bytes_intra + lin.bytes_inter > 0 and lin.compute_ms > 0
    short = make_setup(H100, cfg, 65536, None, 64, 8).linear(64)
    assert (short.bytes_intra, short.bytes_inter) == (lin.bytes_intra, lin.bytes_inter)  # no N
    assert short.compute_ms < lin.compute_ms
    assert setup.pairs == pytest.approx(12 * flops.causal_pairs(262144) / 48)
    attn = setup.attention(64, "ring", {}, "contiguous")
    hybrid = step(setup, 1, 64, attn, Policy("dp_sp", "full"))
    assert hybrid.attention_kinds["linear"] < hybrid.attention_kinds["full"] / 10
    full = make_setup(H100, all_full(cfg), 262144, None, 64, 8)
    assert hybrid.step_ms < step(full, 1, 64, full.attention(64, "ring", {}, "contiguous"),
                                 Policy("dp_sp", "full")).step_ms
    assert {x.layout for x in search(setup, keep=1).fitting} == {"contiguous"}  # LASP's rule


def test_json_carries_model_params_in_every_scope():
    seqpar = str(Path(sys.executable).with_name("seqpar"))
    want = model_params(load("qwen3-8b"))
    for scope in ("attention", "model", "cluster"):
        out = subprocess.run([seqpar, "plan", "--scope", scope, "--model", "qwen3-8b", "--world",
                              "4", "--seq-len", "4096", "--top", "1", "--json"],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["model_params"] == want, scope


def test_the_latent_ring_is_not_planned_under_seq_attn():
    cfg = replace(_hf("DeepseekV3Config"), experts=8, experts_per_tok=2, layers=4,
                  layer_types=("full",) * 4, moe_layers=(3,))
    setup = make_setup(H100, cfg, 32768, None, 8, 1)
    got = search(setup).ranked
    assert {s.json()["mla_pass"] for s in got} == {"kv", "latent"}
    assert not any(s.json()["mla_pass"] == "latent" and s.policy.checkpoint.startswith("seq-attn")
                   for s in got)


def test_a_plan_of_lengths_keeps_lasps_layout_for_linear_layers():
    work = Workload.of("fixed:4096", tokens=2 ** 15, longest=4096, capacity=4096)
    lengths = LengthPlan.make(H100, _hf("Qwen3NextConfig"), work, 8, 1)  # priced, not refused
    with pytest.raises(ConfigError, match="layout='zigzag': must be contiguous"):
        lengths.search(Filters(layout="zigzag", sp=8), ("static",), ("best-fit",))


def test_an_mla_block_is_priced_at_its_value_width_where_v_is_used():
    """QKᵀ at the query/key width and PV at the value width: the kernel's FLOPs and time are the
    mean width's (as the ledger books them), the forward merge moves output rows of the value
    width, and backward adds dq and dk at the query/key width and dv at the value width."""
    from seqpar.planner import clusters
    from seqpar.planner.job import Job
    from seqpar.rules.shape import AttnShape

    local = clusters.load("local")

    def job(d: int, v: int | None) -> Job:
        return Job(local, AttnShape(1, 4096, 8, 8, d, 4, v), 2, 1, "zigzag", True, "float32")

    mla, mean, narrow = job(24, 16), job(20, None), job(16, None)
    q, k = (0,), (1,)
    b = mla.block(q, k, 8)
    assert (b.flops, b.seconds) == (mean.block(q, k, 8).flops, mean.block(q, k, 8).seconds)
    merge = mla.work(b, 8, 1.0, True) - b.seconds
    assert merge == pytest.approx(narrow.work(b, 8, 1.0, True) - b.seconds)
    acc = 8 * 4  # heads x fp32 accumulators
    added = (b.q_len * 24 + b.k_len * (24 + 16)) * acc
    slow = local.backward_slowdown("float32")
    assert mla.work(b, 8, 2.5, True) - 2.5 * b.seconds * slow == pytest.approx(
        local.copy_seconds(added))
