"""What one search holds fixed (`Setup`): the cluster with the kernel's rates, the model, the
step's sequences, ranks and mask; and what follows from them once per configuration, memoised in
its cache: the attention of each layer kind the model has (a sliding layer's under its window:
its kernel's band, and the K,V its ring skips), seq-attn's prefix, the visible pairs a layer sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from seqpar.errors import require
from seqpar.planner import host
from seqpar.planner.api import Prediction, predict
from seqpar.planner.clusters import Cluster
from seqpar.planner.compute import linear_rate
from seqpar.planner.net import Net
from seqpar.planner.rates import gemm_rate
from seqpar.rules import algorithms, masks
from seqpar.rules.counts import LayerClass, layer_classes, mla_rebuild_flops, model_params
from seqpar.rules.flops import causal_pairs, window_pairs
from seqpar.rules.linear import CHUNK, LinearShape, lasp_bytes_by_op, lasp_flops
from seqpar.rules.memory import prefix_layout
from seqpar.rules.model import ModelConfig
from seqpar.rules.shape import DTYPE_BYTES, AttnShape


def shape_of(cfg: ModelConfig, seq_len: int, batch: int = 1, elem_bytes: int = 2) -> AttnShape:
    """A softmax layer's attention (MLA: every head's K,V, query/key and value widths apart)."""
    return AttnShape.of_model(cfg, batch, seq_len, elem_bytes)


@dataclass
class MlaPrediction(Prediction):
    """A multi-head latent attention layer's prediction: its ring passes K,V or the latent."""

    mla_pass: str = "kv"

    def json(self) -> dict[str, Any]:
        return {**super().json(), "mla_pass": self.mla_pass}


def _with_pass(p: Prediction, mla_pass: str, **changes: Any) -> MlaPrediction:
    base = {f.name: getattr(p, f.name) for f in fields(Prediction)}
    return MlaPrediction(**{**base, **changes}, mla_pass=mla_pass)


@dataclass(frozen=True)
class Setup:
    """What one search holds fixed: the cluster (with the kernel's rates), the model, the step."""

    cluster: Cluster
    cfg: ModelConfig
    seq_len: int
    tokens_per_step: int | None  # all ranks together (None: one sequence per DP replica a step)
    world: int              # all ranks: DP x SP
    nodes: int
    dtype: str = "bfloat16"
    batch: int = 1          # sequences per micro-step of a DP rank
    kernel: str = "flash2"
    kernel_source: str = ""
    causal: bool = True
    mask: masks.Mask | None = None  # any mask of seq_len tokens (None: plain causal / full)
    routing_skew: float = 1.0  # a mixture's busiest EP rank's routed pairs over the mean (`ep`)
    # a hybrid's linear layers under SP: lasp2 | lasp1 | auto (the faster at each SP size; a
    # search's, `step.layer_kinds`)
    linear_sp: str = "lasp2"
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @cached_property
    def net(self) -> Net:
        return Net(self.cluster, self.world, self.nodes)

    @cached_property
    def shape(self) -> AttnShape:
        return shape_of(self.cfg, self.seq_len, self.batch, DTYPE_BYTES[self.dtype])

    @cached_property
    def per_node(self) -> int:  # asked at every configuration a search times: held
        return max(1, self.world // self.nodes)

    def step_tokens(self, dp: int) -> int:
        """Tokens a step of a DP x SP split trains on, all ranks together."""
        return self.tokens_per_step or self.seq_len * self.batch * dp

    def micro_batches(self, dp: int) -> int:
        """Micro-steps per step of each DP rank (0 when the tokens do not split evenly)."""
        per_rank = self.seq_len * self.batch * dp
        tokens = self.step_tokens(dp)
        return tokens // per_rank if tokens % per_rank == 0 else 0

    def sp_nodes(self, sp: int) -> int:
        return max(1, sp // self.per_node)

    def attention(self, sp: int, name: str, options: dict[str, Any], layout: str) -> Prediction:
        """One layer's attention (forward + backward) over an SP group of sp ranks (an MLA
        model's: with K,V on the ring, `mla_pass` kv)."""
        p = predict(host.bare(self.cluster), name, self.shape, sp, nodes=self.sp_nodes(sp),
                    options=options,
                    layout=layout, causal=self.causal, dtype=self.dtype, mask=self.mask)
        return _with_pass(p, "kv") if self.cfg.mla else p

    def latent(self, sp: int, kv: Prediction) -> MlaPrediction | None:
        """`kv`'s configuration with MLA's latent on the ring in place of K,V (mla_pass latent;
        None where the algorithm moves heads, not shards): its bytes and the links' busy time
        scaled by the latent's bytes over K,V's (`latent_bytes` over `bytes_of_rank`, the
        algorithm's rules), the exposed communication less the time saved, and the rebuild of
        every arriving shard's K,V (wkv_b over the other sp - 1 shards' tokens, usp's members
        their heads alone: forward, and backward twice) added to the compute. The latent's
        smaller buffers are not credited to the peak (K,V's held)."""
        rules = algorithms.get(kv.algorithm)
        if not self.cfg.mla or sp == 1 or not rules.latent_pass:
            return None
        width = self.cfg.kv_lora_rank + self.cfg.qk_rope_dim
        sent = sum(rules.latent_bytes(self.shape, sp, kv.options, 0, width).values())
        full = sum(rules.bytes_of_rank(self.shape, sp, kv.options, 0).values())
        r = sent / full if full else 1.0
        tokens = (sp - 1) * self.shape.shard_len(sp) * self.shape.batch
        # usp: each head-parallel member rebuilds its own heads from every token's latent
        dhp = rules.parse(kv.options).resolved(sp)[0] if kv.algorithm == "usp" else 1
        rate = gemm_rate(self.cluster, self.dtype, min(tokens, self.cfg.kv_lora_rank))
        fwd = 1e3 * mla_rebuild_flops(self.cfg, tokens) / dhp / rate
        exposed = {k: max(0.0, v - (1 - r) * kv.link_ms.get(k, 0.0))
                   for k, v in kv.exposed_ms.items()}
        saved = sum(kv.exposed_ms.values()) - sum(exposed.values())
        share = kv.forward_ms / kv.attention_ms if kv.attention_ms else 0.5
        return _with_pass(
            kv, "latent", attention_ms=kv.attention_ms - saved + 3 * fwd,
            forward_ms=kv.forward_ms - share * saved + fwd, compute_ms=kv.compute_ms + 3 * fwd,
            exposed_ms=exposed, bytes_intra=round(r * kv.bytes_intra),
            bytes_inter=round(r * kv.bytes_inter),
            forward_bytes=(round(r * kv.forward_bytes[0]), round(r * kv.forward_bytes[1])),
            link_ms={k: r * v for k, v in kv.link_ms.items()},
            forward_link_ms={k: r * v for k, v in kv.forward_link_ms.items()})

    def linear(self, sp: int, mode: str | None = None) -> Prediction:
        """One linear-attention layer (forward + backward) over an SP group of sp ranks under
        `mode` (None: `linear_sp`; auto prices LASP-2): the chunked delta rule over a rank's
        shard at the GEMM rate of a chunk's products, backward twice the forward
        (`compute.linear_at_rate` puts the rule at its measured rate); the convolution's halo
        to the next rank, exposed (the rule waits on it).
        LASP-2: the last rank's augmented pass and scan over every earlier rank's pair
        (`rules.linear.lasp_flops`), the all-gather of (transition, state) pairs forward and its
        reduce-scatter backward, exposed. LASP-1: the plain pass, each rank's state sent on to the
        next, which waits for it: a chain of sp - 1 passes and messages each way, in every layer
        (`_lasp1_chain`; memoised)."""
        mode = mode or self.linear_sp
        mode = "lasp2" if mode == "auto" else mode
        key = ("linear", sp, mode)
        got = self.cache.get(key)
        if got is not None:
            return got
        shape = LinearShape.of(self.cfg, self.shape.batch, self.shape.elem_bytes)
        tokens = self.shape.shard_len(sp)
        flops = lasp_flops(mode, shape, tokens, sp, sp - 1)
        fwd = flops / gemm_rate(self.cluster, self.dtype, CHUNK)
        cost = {"forward": [], "backward": []}
        groups = [list(range(g * sp, (g + 1) * sp)) for g in range(max(1, self.world // sp))]
        for (op, phase), n in lasp_bytes_by_op(mode, shape, sp, 0, self.seq_len).items():
            if op == "p2p":
                pairs = [(g[i], g[i + 1]) for g in groups for i in range(sp - 1)]
                cost[phase].append(self.net.p2p(pairs, n))
            else:
                cost[phase].append(self.net.collective(groups, n))
        if mode == "lasp1" and sp > 1:  # the state's messages (the last two p2p) wait on passes
            cost = self._lasp1_chain(cost, shape, tokens, sp)
        exposed = {"intra": 0.0, "inter": 0.0}
        link = {"intra": 0.0, "inter": 0.0}
        forward_link = {"intra": 0.0, "inter": 0.0}
        for phase, costs in cost.items():
            for one in costs:
                exposed[one.link] += 1e3 * one.seconds
                for k in link:
                    link[k] += 1e3 * one.busy(k)
                    if phase == "forward":
                        forward_link[k] += 1e3 * one.busy(k)
        comm_fwd = sum(1e3 * one.seconds for one in cost["forward"])
        moved = [sum(getattr(one, k) for costs in cost.values() for one in costs)
                 for k in ("intra", "inter")]
        got = self.cache[key] = Prediction(
            mode, {}, "contiguous", 3e3 * fwd + sum(exposed.values()), 1e3 * fwd + comm_fwd,
            3e3 * fwd, exposed, moved[0], moved[1], 0, True, "compute",
            forward_bytes=tuple(sum(getattr(one, k) for one in cost["forward"])  # type: ignore
                                for k in ("intra", "inter")),
            link_ms=link, forward_link_ms=forward_link)
        return got

    def _lasp1_chain(self, cost: dict[str, list], shape: LinearShape, tokens: int, sp: int
                     ) -> dict[str, list]:
        """LASP-1's state messages with the chain they sit in: rank r starts its pass when rank
        r - 1's state arrives, so the last rank waits sp - 1 passes (at the rule's measured
        rate, `compute.linear_rate`) and messages, forward and (twice the pass) backward, in every
        linear layer: the next layer's halo exchange is a rendezvous (a send completes when its
        receiver has posted the receive: gloo's and NCCL's point-to-point alike), so the ranks
        cannot run a layer apart (measured here, kinds-hybrid at P = 2 under Ulysses: LASP-1's
        step 372 ms against LASP-2's 261, its main threads' CPU only 22-25 ms more)."""
        rate = linear_rate(self.cluster, self.dtype, self.cfg.lin_k_dim)
        pass_s = lasp_flops("lasp1", shape, tokens, sp, 0) / rate  # forward: a third of 3x the FLOPs
        out = {}
        for phase, factor in (("forward", 1.0), ("backward", 2.0)):
            *halo, state = cost[phase]
            wait = (sp - 1) * (factor * pass_s + state.seconds)
            out[phase] = [*halo, replace(state, seconds=wait)]
        return out

    def prefix(self, sp: int, attn: Prediction, fraction: float, kind: str = "full") -> Prediction:
        """The forward seq-attn re-runs in backward: the attention over the first fraction x N
        tokens (every rank's first fraction of its shard), in the layout that deals that prefix
        (`rules.memory.prefix_layout`), as causal attention (a sliding layer's: within its
        window; memoised)."""
        key = ("prefix", sp, attn.algorithm, tuple(sorted(attn.options.items())), attn.layout,
               fraction, kind)
        got = self.cache.get(key)
        if got is None:
            rows = max(1, round(fraction * self.shape.shard_len(sp)))  # the runner's rows a rank
            shape = replace(self.shape, seq_len=rows * sp)
            w = self.cfg.window
            mask = (masks.sliding_window(rows * sp, w) if kind == "sliding" and w < rows * sp
                    else None)
            got = self.cache[key] = predict(
                host.bare(self.cluster), attn.algorithm, shape, sp, nodes=self.sp_nodes(sp),
                options=attn.options, layout=prefix_layout(attn.layout, sp, fraction),
                causal=True, dtype=self.dtype, mode="fwd", mask=mask)
        return got

    @cached_property
    def classes(self) -> tuple[LayerClass, ...]:
        """The model's layers by class (`rules.counts.layer_classes`)."""
        return layer_classes(self.cfg)

    @cached_property
    def sliding_mask(self) -> masks.Mask | None:
        """A sliding layer's mask: the step's relation within the model's window (None: the
        window holds every key a query sees, a full layer's). A mask that is no classic relation
        (block-sparse, ...) has no window form: refused in one line."""
        w, n = self.cfg.window, self.seq_len
        if "sliding" not in self.cfg.layer_types or w >= n:
            return None
        if self.mask is None:
            return masks.sliding_window(n, w, causal=self.causal)
        rel = self.mask.relation
        require(rel is not None, "mask", self.mask.spec or "slices",
                f"has no sliding-window form for the model's sliding layers (window {w}): plan "
                "causal, window or documents masks with such a model")
        window = w if rel.window is None else min(w, rel.window)
        return masks.documents(rel.cu or (0, n), rel.causal, window)

    def kinds(self, sp: int, attn: Prediction) -> dict[str, Prediction]:
        """One layer's attention of each kind the model has (full: `attn`, this configuration's;
        sliding: the same configuration under `sliding_mask`, its kernel's band and the K,V its
        ring skips; memoised)."""
        out = {}
        for kind in dict.fromkeys(c.kind for c in self.classes):
            if kind == "linear":
                out[kind] = self.linear(sp)
                continue
            mask = self.sliding_mask if kind == "sliding" else None
            if mask is None:
                out[kind] = attn
                continue
            key = ("kind", kind, sp, attn.algorithm, tuple(sorted(attn.options.items())),
                   attn.layout)
            got = self.cache.get(key)
            if got is None:
                got = self.cache[key] = replace(predict(
                    host.bare(self.cluster), attn.algorithm, self.shape, sp,
                    nodes=self.sp_nodes(sp), options=attn.options, layout=attn.layout,
                    causal=self.causal, dtype=self.dtype, mask=mask), options=attn.options)
            out[kind] = got
        return out

    @property
    def pairs(self) -> float:
        """Visible (query, key) pairs of one sequence a layer, on average over the layers: the
        mask's area (N²/2 causal, N² full) in a full layer, its window's in a sliding one."""
        if self.mask is not None:
            full = float(self.mask.area)
        else:
            full = causal_pairs(self.seq_len) if self.causal else float(self.seq_len) ** 2
        if len({c.kind for c in self.classes}) == 1 and self.classes[0].kind == "full":
            return full
        sliding = self.sliding_mask
        each = {"full": full, "sliding": full if sliding is None else float(sliding.area),
                "linear": 0.0}
        if sliding is not None and self.mask is None and self.causal:
            each["sliding"] = window_pairs(self.seq_len, self.cfg.window)
        return sum(c.count * each[c.kind] for c in self.classes) / self.cfg.layers

    @property
    def model_params(self) -> dict[str, int]:
        """{"total", "active"} parameters of the model (`rules.counts.model_params`)."""
        return model_params(self.cfg)
