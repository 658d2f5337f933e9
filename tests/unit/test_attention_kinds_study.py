"""The `attention-kinds` study: MHA, GQA, MLA (its ring carrying K,V or the latent) and a
Qwen3-Next-like linear hybrid trained at equal width (the same vocabulary, hidden size, layers,
query heads and feed-forward; models/kinds-*.json), with ring and Ulysses; every point a valid trial
the planner prices, the latent ring priced apart from the K,V ring (what `seqpar plan --validate`
holds it to)."""

from __future__ import annotations

import pytest

from seqpar import planner
from seqpar.case import TrainCase
from seqpar.experiments.kind_studies import KINDS
from seqpar.experiments.registry import MEMORY_CLUSTER, STUDIES
from seqpar.planner import clusters, compute
from seqpar.planner.rates import gemm_rate
from seqpar.rules.linear import CHUNK, LinearShape, lasp_flops

STUDY = STUDIES["attention-kinds"]
WIDTH = ("vocab", "hidden", "layers", "heads", "ffn", "rope_theta", "experts")


def test_the_cpu_preset_trains_every_kind_at_equal_width():
    points = STUDY.points("cpu")
    cases = [p.spec.to_case() for p in points if p.spec is not None]
    assert all(isinstance(c, TrainCase) and c.world == 2 and c.layout == "contiguous"
               for c in cases)
    runs = {(c.model, c.mla_pass, c.linear_sp, c.algorithm) for c in cases}
    assert runs == {(m, o.get("train.mla_pass", "kv"), o.get("train.linear_sp"), a)
                    for _, m, o in KINDS for a in ("ring", "ulysses")} - {
        ("kinds-mla", "latent", None, "ulysses")}
    skipped = [p for p in points if p.spec is None]  # Ulysses moves heads, not a latent
    assert len(skipped) == 1 and "not ulysses" in str(skipped[0].error)
    cfgs = {c.model: c.config() for c in cases}
    width = {tuple(getattr(cfg, k) for k in WIDTH) for cfg in cfgs.values()}
    assert len(width) == 1  # equal width
    mha, gqa, mla, hybrid = (cfgs[f"kinds-{k}"] for k in ("mha", "gqa", "mla", "hybrid"))
    d = mha.hidden // mha.heads
    assert (mha.kv_heads, gqa.kv_heads) == (mha.heads, mha.heads // 4)
    assert mla.mla and (mla.head_dim, mla.v_head_dim, mla.kv_lora_rank) == (3 * d // 2, d, 4 * d)
    assert hybrid.layer_types == ("linear",) * 3 + ("full",)
    assert hybrid.lin_v_heads * hybrid.lin_v_dim == hybrid.hidden


@pytest.mark.parametrize("preset", ("cpu", "gpu-cluster"))
def test_every_point_is_priced_and_the_latent_ring_sends_fewer_bytes(preset):
    cluster = clusters.load(MEMORY_CLUSTER[preset])
    priced = {}
    for p in STUDY.points(preset):
        if p.spec is not None:
            step = planner.predict_trial(p.spec, cluster)
            assert 0 < step.step_ms and step.peak_mem_bytes <= cluster.memory_gb * 1e9
            c = p.spec.to_case()
            priced[(c.model, c.mla_pass, c.algorithm)] = step
    mla = next(m for m, _, _ in priced if m.startswith("kinds-mla"))
    kv, latent = priced[(mla, "kv", "ring")], priced[(mla, "latent", "ring")]
    assert latent.attention.mla_pass == "latent" and kv.attention.mla_pass == "kv"
    assert 0 < latent.attention.bytes_intra + latent.attention.bytes_inter \
        < kv.attention.bytes_intra + kv.attention.bytes_inter


def test_a_linear_layer_is_priced_at_its_measured_rate_where_the_cluster_has_one():
    """On this machine a linear layer's mixer (torch's chunked rule, its convolution, norms and
    gates) runs at the rate `seqpar calibrate` measured by head dim, interpolated between the
    measured dims and held at the ends; a cluster without the table (a GPU's: fla) at the GEMM
    rate of a chunk's products, as before."""
    local = clusters.load("local")
    table = local.linear_tflops_by_dim
    assert table and all(r > 0 for r in table.values())
    dims = sorted(table)
    lo, hi = dims[0], dims[1]
    mid = compute.linear_rate(local, "float32", (lo + hi) // 2)
    assert compute.linear_rate(local, "float32", lo // 2) == table[lo] * 1e12
    assert compute.linear_rate(local, "float32", 4 * dims[-1]) == table[dims[-1]] * 1e12
    assert min(table[lo], table[hi]) * 1e12 <= mid <= max(table[lo], table[hi]) * 1e12
    h100 = clusters.load("h100-sxm")
    assert compute.linear_rate(h100, "bfloat16", 128) == gemm_rate(h100, "bfloat16", CHUNK)

    spec = next(p.spec for p in STUDY.points("cpu")
                if p.spec is not None and p.spec.to_case().model == "kinds-hybrid")
    measured = planner.predict_trial(spec, local)
    bare = planner.predict_trial(spec, local.model_copy(update={"linear_tflops_by_dim": {}}))
    assert measured.attention_kinds["full"] == bare.attention_kinds["full"]
    slower = gemm_rate(local, "float32", CHUNK) / compute.linear_rate(local, "float32", 16)
    assert slower > 5  # a few GFLOP/s against a GEMM's ~100
    # the rule's forward + backward (the last rank's: LASP-2's augmented pass and scan) from the
    # GEMM rate to the measured one; its communication unchanged
    case = spec.to_case()
    flops = lasp_flops("lasp2", LinearShape.of(case.config(), 1, 4), case.seq_len // 2, 2, 1)
    rule_ms = 3e3 * flops / gemm_rate(local, "float32", CHUNK)
    assert measured.attention_kinds["linear"] == pytest.approx(
        bare.attention_kinds["linear"] + rule_ms * (slower - 1))
    assert measured.step_ms > bare.step_ms


def test_a_linear_layers_kept_activations_are_what_autograd_saves():
    """`rules.memory.linear_saved` against the bytes autograd saves for one gated DeltaNet call on
    one process (each storage once, the parameters and the input left out): within 15%, at two
    shapes whose key and value widths differ."""
    import torch

    from seqpar.model.deltanet import DeltaNet
    from seqpar.rules.memory import linear_saved
    from seqpar.rules.model import ModelConfig, param_shapes

    gen = torch.Generator().manual_seed(0)
    for hk, hv, dk, dv, n in ((2, 6, 8, 12, 256), (4, 8, 16, 16, 384)):
        cfg = ModelConfig(vocab=2, hidden=hv * dv, layers=1, heads=hv, kv_heads=hv, ffn=2,
                          family="qwen3_next", layer_types=("linear",), lin_k_heads=hk,
                          lin_v_heads=hv, lin_k_dim=dk, lin_v_dim=dv, conv_kernel=4)
        p = {k.split(".")[-1]: (0.1 * torch.randn(*s, generator=gen)).requires_grad_()
             for k, s in param_shapes(cfg).items() if ".lin_" in k}
        x = torch.randn(1, n, cfg.hidden, generator=gen, requires_grad=True)
        skip = {t.untyped_storage().data_ptr() for t in (x, *p.values())}
        kept: dict[int, int] = {}

        def pack(t, kept=kept, skip=skip):
            key = t.untyped_storage().data_ptr()
            if key not in skip:
                kept[key] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            DeltaNet()(x, p, cfg)
        measured = sum(kept.values()) / 4 / n
        assert linear_saved(cfg) == pytest.approx(measured, rel=0.15), (cfg, measured)


def test_validate_gives_the_error_with_the_ranks_share_of_a_busy_host():
    """A trial whose host's other processes took half of it ran twice as long as its prediction:
    0 error with the ranks' fair share; the plain error stays beside it."""
    from seqpar.planner import plan as perf_plan

    busy = perf_plan.Check("a", 200.0, 100.0, "g", others=0.5)
    quiet = perf_plan.Check("b", 110.0, 100.0, "g")
    assert busy.error == pytest.approx(-0.5) and busy.shared_error == pytest.approx(0.0)
    assert quiet.shared_error == quiet.error
    s = perf_plan.summary([busy, quiet])
    assert s["median_abs_error"] == pytest.approx((0.5 + 10 / 110) / 2)
    assert s["median_abs_error_host_share"] == pytest.approx(10 / 110 / 2)


def test_lasp1_is_priced_as_its_chain_of_states_and_lasp2_as_its_all_gather():
    """LASP-1 (`train.linear_sp: lasp1`): the plain pass, one state a direction whatever the
    ranks, and the chain: the last rank waits sp - 1 of the earlier ranks' passes (the rule at
    its measured rate) and messages, forward and (twice the pass) backward, in every linear layer
    (the next layer's halo exchange is a rendezvous: the ranks cannot run a layer apart). LASP-2:
    the augmented pass and the pairs' all-gather, no chain."""
    from dataclasses import replace

    from seqpar.planner.setup import Setup

    local = clusters.load("local")
    spec = next(p.spec for p in STUDY.points("cpu")
                if p.spec is not None and p.spec.to_case().model == "kinds-hybrid")
    cfg = spec.to_case().config()
    assert cfg.layer_types == ("linear",) * 3 + ("full",)  # one run of three

    def layer(mode: str, sp: int, c=cfg):
        return Setup(local, c, 4096, None, sp, 1, "float32", linear_sp=mode).linear(sp)

    two, four = layer("lasp1", 2), layer("lasp1", 4)
    shape = LinearShape.of(cfg, 1, 4)
    assert two.algorithm == "lasp1" and layer("lasp2", 2).algorithm == "lasp2"
    assert two.compute_ms == pytest.approx(3e3 * lasp_flops("lasp1", shape, 2048, 2, 1)
                                           / gemm_rate(local, "float32", CHUNK))
    forward = lasp_flops("lasp1", shape, 1024, 4, 3) / compute.linear_rate(local, "float32",
                                                                           cfg.lin_k_dim)
    # 3 earlier ranks x (forward + twice it backward), plus the messages
    chain = sum(four.exposed_ms.values())
    assert 9e3 * forward < chain < 9e3 * forward * 1.1
    assert four.bytes_intra == two.bytes_intra  # one state (and the halo) whatever the ranks
    assert layer("lasp2", 4).bytes_intra > layer("lasp2", 2).bytes_intra  # the pairs: sp - 1
    assert sum(layer("lasp2", 4).exposed_ms.values()) < chain / 10
    # a linear layer waits its whole chain whether full layers part the linear ones or not
    alone = replace(cfg, layer_types=("linear", "full") * 2)
    assert sum(layer("lasp1", 4, c=alone).exposed_ms.values()) == pytest.approx(chain, rel=0.05)
    # a trial that pins LASP-1 is priced as LASP-1
    lasp1 = type(spec).model_validate(
        {**spec.model_dump(), "train": {**spec.train.model_dump(), "linear_sp": "lasp1"}})
    assert lasp1.to_case().linear_sp == "lasp1"
    pinned = Setup(local, cfg, spec.workload.seq_len, None, 2, 1, "float32", linear_sp="lasp1")
    assert planner.predict_trial(lasp1, local).attention_kinds["linear"] == pytest.approx(
        compute.linear_at_rate(local, cfg, "float32", pinned.linear(2)).attention_ms)
    assert planner.predict_trial(spec, local).attention_kinds["linear"] != pytest.approx(
        planner.predict_trial(lasp1, local).attention_kinds["linear"])


def test_a_search_takes_the_faster_of_lasp2_and_lasp1_and_names_it():
    """A plan's linear layers run under whichever of LASP-2 and LASP-1 prices faster at each SP
    size (`linear_sp` auto): on 8 H100s of one node LASP-2's all-gather is the cheaper, on 128
    over 16 nodes the pairs' all-gather (each rank receives 127) costs more than LASP-1's chain.
    The step says which (`linear_sp`), and pinning one prices that one."""
    from importlib.resources import files

    from seqpar.planner.policy import Filters
    from seqpar.planner.search import make_setup, search
    from seqpar.planner.step import layer_kinds

    model = str(files("seqpar.experiments") / "models" / "kinds-hybrid-8b.json")
    h100 = clusters.load("h100-sxm")
    chose = {}
    for world, nodes in ((8, 1), (128, 16)):
        auto = make_setup(h100, model, 262144, None, world, nodes)
        attn = auto.attention(world, "ring", {}, "contiguous")
        both = {mode: layer_kinds(make_setup(h100, model, 262144, None, world, nodes,
                                             linear_sp=mode), world, attn)["linear"]
                for mode in ("lasp2", "lasp1")}
        got = layer_kinds(auto, world, attn)["linear"]
        assert got.attention_ms == min(p.attention_ms for p in both.values())
        chose[world] = got.algorithm
        steps = search(auto, Filters(sp=world), keep=3).ranked
        assert steps and all(s.linear_sp == got.algorithm for s in steps)
        assert steps[0].json()["linear_sp"] == got.algorithm
    assert chose == {8: "lasp2", 128: "lasp1"}
