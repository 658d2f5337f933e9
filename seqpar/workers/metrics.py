"""A trial's numbers, computed once, on the driver, from its ranks' records: `TrialMetrics`.

    metrics = TrialMetrics.of(trial, per_rank, setup_s=.., run_s=..)   # the TrialRunner does this
    metrics["step_ms"], metrics.unstable, metrics.kernel, metrics.series["iter_step_ms"]

The runner logs it to MLflow and hands it to the report as it is; nothing recomputes it.
Conventions: a step is one iteration on every rank, so step time is the max over ranks of that
iteration (the slowest rank sets the pace), and its median over iterations is `step_ms` (with its
95% interval and the hosts' noise: `workers.stability`). Bytes are one iteration's:
`bytes_<phase>_<op>_<link>` is per rank (max over ranks), while `bytes_total`, `bytes_intra` and
`bytes_inter` are the whole gang's (sum over ranks), so intra + inter = total;
`bytes_analytic_per_rank` is the algorithm's own count (`seqpar.algorithms.expected_bytes`) for an
attention trial. FLOPs are the ledger's: each kernel call counts the (query, key) pairs it computes,
so blocks no query sees count nothing. Memory: the worst rank's peak over the timed iterations
(`peak_mem_bytes`; on CUDA also the allocator's reserved peak and the device's own view). An
accuracy trial adds `err_out`, `err_dq`, `err_dk`, `err_dv` (relative to float64, max over ranks)
and `err_max`; a training trial tokens/s of the whole DP x SP job, TGS, model FLOP/s and the
memory levers. Every rank records the attention kernel it ran and its GEMM dtype; ranks that
disagree make the trial unstable.

Utilisation, named as `rules.flops.CONVENTIONS` defines them (the planner's names too), with a
known device peak: `mfu` counts the FLOPs the step really does, attention by the pairs its mask
lets a query see (from the ledger's backward kernels, which run once whatever is checkpointed),
its backward 2x, no recompute; a training trial adds `mfu_unmasked_attention` (torchtitan's:
attention as if unmasked) and `hfu` (what the kernels ran: attention backward 2.5x and the
recompute); an attention trial's `hfu` is its kernels' FLOPs (`tflops_per_s`, MagiAttention's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from seqpar import algorithms
from seqpar.case import Case, TrainCase, Trial
from seqpar.model import flops as model_flops
from seqpar.platform.devices import peak_flops
from seqpar.rules.cost_model import CostModel
from seqpar.workers import policy_metrics, stability

if TYPE_CHECKING:  # a rank's record; the training measure imports step_metrics from here
    from seqpar.workers.measure.record import RankMeasurement

MEMORY_KEYS = ("mem_reserved_bytes", "mem_device_used_bytes")  # CUDA only: beside peak_mem_bytes


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; a single value is every percentile."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def per_step(per_rank: Sequence[RankMeasurement], attr: str = "step_ms") -> list[float]:
    """Each iteration's time on the slowest rank."""
    series = [getattr(m, attr) for m in per_rank]
    return [max(values) for values in zip(*series, strict=True)]


def link_bytes(m: RankMeasurement, link: str) -> int:
    """One iteration's bytes this rank sent over `link` ('intra' | 'inter')."""
    return sum(e["bytes_sent"] for e in m.ledger.get("entries", []) if e["link"] == link)


def _bytes_by_key(m: RankMeasurement) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in m.ledger.get("entries", []):
        key = f"bytes_{e['phase']}_{e['op']}_{e['link']}"
        out[key] = out.get(key, 0) + e["bytes_sent"]
    return out


def analytic_bytes(case: Case) -> float | None:
    """The bytes one rank sends per step by the algorithm's own count (forward, and backward where
    the mode runs it), on the call's mask; None for an algorithm without a formula."""
    try:
        by_phase = algorithms.expected_bytes(case.algorithm, case.shape, case.world,
                                             layout=case.layout, causal=case.causal,
                                             cu_seqlens=case.cu_seqlens or None,
                                             window=case.window, mask=case.attention_mask,
                                             **case.option_dict)
    except NotImplementedError:
        return None
    return float(by_phase["forward"] + (by_phase["backward"] if case.mode != "fwd" else 0))


def step_metrics(case: TrainCase, step_s: float, peak_device: float | None,
                 attention_backward_flops: float | None = None) -> dict[str, float]:
    """Throughput of one training step of the whole DP x SP job: tokens/s, TGS, model FLOP/s per
    device (`mfu`'s count) and the utilisation in every convention (with a known device peak).
    The attention's visible pairs: from `attention_backward_flops` (the ledger's backward kernels,
    all ranks: any mask or packed documents by its area), else the case's mask or causal."""
    if case.lengths:
        return _lengths_step_metrics(case, step_s, peak_device, attention_backward_flops)
    cfg, world, sequences = case.config(), case.world, case.batch * case.dp
    tokens = sequences * case.seq_len
    mask = case.attention_mask
    pairs = (model_flops.visible_pairs(attention_backward_flops, cfg, sequences)
             if attention_backward_flops else None if mask is None else float(mask.area))
    recomputed = model_flops.recomputed_flops(cfg, case.batch, case.seq_len, case.sp,
                                              case.checkpoint, case.seq_fraction, pairs) * world
    counts = model_flops.conventions(cfg, sequences, case.seq_len, pairs, recomputed)
    row = {"step_s": step_s, "tokens_per_s": tokens / step_s, "tgs": tokens / step_s / world,
           "model_flops_per_s": counts["mfu"] / world / step_s}
    if peak_device is not None:
        row.update({name: n / world / step_s / peak_device for name, n in counts.items()})
    return row


def _lengths_step_metrics(case: TrainCase, step_s: float, peak_device: float | None,
                          attention_backward_flops: float | None) -> dict[str, float]:
    """`step_metrics` of a step of variable-length sequences (its batches' average): tokens are
    the step's, attention counts each sequence's own pairs (the ledger's, else causal under the
    window), the unmasked convention each sequence's L², hfu the token-wise recompute beside."""
    cfg, world = case.config(), case.world
    count = len(case.batches)
    tokens = sum(s.length for b in case.batches for s in b.sequences) / count
    pairs_of = CostModel(window=case.window).pairs
    pairs = (model_flops.visible_pairs(attention_backward_flops, cfg, 1)
             if attention_backward_flops else
             sum(pairs_of(s.length) for b in case.batches for s in b.sequences) / count)
    squares = sum(float(s.length) ** 2 for b in case.batches for s in b.sequences) / count
    recomputed = sum(model_flops.recomputed_flops(cfg, 1, s.length, 1, case.checkpoint,
                                                  case.seq_fraction)
                     for b in case.batches for s in b.sequences) / count
    counts = {"mfu": model_flops.step_flops(cfg, 1, round(tokens), pairs),
              "mfu_unmasked_attention": model_flops.step_flops(cfg, 1, round(tokens), squares),
              "hfu": model_flops.step_flops(cfg, 1, round(tokens), pairs,
                                            model_flops.BACKWARD_FLOPS) + recomputed}
    row = {"step_s": step_s, "tokens_per_s": tokens / step_s, "tgs": tokens / step_s / world,
           "model_flops_per_s": counts["mfu"] / world / step_s}
    if peak_device is not None:
        row.update({name: n / world / step_s / peak_device for name, n in counts.items()})
    return row


def _training(case: TrainCase, ranks: Sequence[RankMeasurement], step_ms: float,
              device_name: str) -> dict[str, float]:
    """The training headline numbers (step time: the slowest rank's median)."""
    backward = sum(m.flops.get("backward", 0.0) for m in ranks)
    out = step_metrics(case, step_ms / 1e3, peak_flops(device_name, case.dtype), backward)
    out.pop("step_s")
    summaries = [m.extra.get("train", {}) for m in ranks]
    for key in ("activation_bytes", "state_bytes", "recomputed_flops", "loss_last"):
        values = [s[key] for s in summaries if key in s]
        if values:
            out[key] = float(max(values))
    out["params"] = float(case.config().params())
    loads = [m.extra["expert_load"] for m in ranks if m.extra.get("expert_load")]
    if loads:
        out["expert_imbalance"] = expert_imbalance(loads)
    return out


def expert_imbalance(loads: Sequence[Sequence[Sequence[int]]]) -> float:
    """The experts' load imbalance: per MoE layer, the pairs routed to the busiest expert over
    the mean pairs an expert (every rank's tokens, every step summed: loads[rank][layer][e]),
    averaged over the layers (1: even; E / k at worst, every pair on k experts)."""
    ratios = []
    for layer in zip(*loads, strict=True):
        per_expert = [sum(col) for col in zip(*layer, strict=True)]
        mean = sum(per_expert) / len(per_expert)
        ratios.append(max(per_expert) / mean if mean else 1.0)
    return sum(ratios) / len(ratios)


def _values(case: Case | TrainCase, ranks: Sequence[RankMeasurement], setup_s: float,
            run_s: float) -> dict[str, float]:
    steps = per_step(ranks)
    timing = stability.step_stats(steps)
    step_ms = timing["step_ms"]
    tokens_per_s = case.batch * case.seq_len / (step_ms / 1e3)
    rank_flops = [sum(m.flops.values()) for m in ranks]
    out: dict[str, float] = {
        **timing, **stability.host_noise([m.noise for m in ranks]),
        "step_ms_p10": percentile(steps, 10), "step_ms_p90": percentile(steps, 90),
        "fwd_ms": statistics.median(per_step(ranks, "fwd_ms")),
        "bwd_ms": statistics.median(per_step(ranks, "bwd_ms")),
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_rank": tokens_per_s / case.world,
        "attn_flops": sum(rank_flops),  # one step, all ranks: the pairs the kernels computed
        "attn_tflops": sum(rank_flops) / (step_ms / 1e3) / 1e12,
        # per device, MagiAttention's definition: the mask's visible pairs (the kernels' FLOPs,
        # backward 2.5x forward) over the slowest rank's time
        "tflops_per_s": sum(rank_flops) / (step_ms / 1e3) / 1e12 / case.world,
        "peak_mem_bytes": float(max(m.peak_mem_bytes for m in ranks)),
        "load_imbalance": (max(rank_flops) / statistics.mean(rank_flops)
                           if sum(rank_flops) > 0 else 1.0),
        "setup_s": setup_s, "run_s": run_s,
    }
    for key in MEMORY_KEYS:  # the allocator's reserved peak and the device's view (CUDA)
        seen = [m.memory[key] for m in ranks if key in m.memory]
        if seen:
            out[key] = float(max(seen))
    device_name = str(ranks[0].extra.get("device_name", "cpu"))
    peak = peak_flops(device_name, case.dtype)
    if peak is not None and isinstance(case, Case):  # a training trial's: `step_metrics`
        forward = sum(m.flops.get("forward", 0.0) for m in ranks)
        backward = sum(rank_flops) - forward
        model = forward + backward * model_flops.MODEL_BACKWARD_FLOPS / model_flops.BACKWARD_FLOPS
        out["mfu"] = model / (step_ms / 1e3) / (peak * case.world)
        out["hfu"] = out["attn_tflops"] * 1e12 / (peak * case.world)
    detail: dict[str, int] = {}
    for m in ranks:
        for key, value in _bytes_by_key(m).items():
            detail[key] = max(detail.get(key, 0), value)
    out.update({k: float(v) for k, v in sorted(detail.items())})
    out["bytes_intra"] = float(sum(link_bytes(m, "intra") for m in ranks))
    out["bytes_inter"] = float(sum(link_bytes(m, "inter") for m in ranks))
    out["bytes_total"] = out["bytes_intra"] + out["bytes_inter"]
    if isinstance(case, Case) and (analytic := analytic_bytes(case)) is not None:
        out["bytes_analytic_per_rank"] = analytic
    errors = [m.extra.get("errors") for m in ranks]
    if all(errors):  # an accuracy trial: each tensor's relative error (max over ranks)
        for name in errors[0]:
            out[f"err_{name}"] = max(e[name] for e in errors)
        out["err_max"] = max(out[f"err_{name}"] for name in errors[0])
    if isinstance(case, TrainCase):  # a model training trial: TGS, MFU, memory levers
        out.update(_training(case, ranks, step_ms, device_name))
        out["tokens_per_s_per_rank"] = out["tgs"]  # the whole job's tokens over its ranks
        if case.lengths:  # a step of sequences dealt to groups: the policy's own numbers
            out.update(policy_metrics.values(case, ranks))
    return out


@dataclass(frozen=True, eq=False)
class TrialMetrics(Mapping[str, float]):
    """A finished trial's metrics (a read-only mapping: name -> value), its per-iteration series,
    the kernel and GEMM dtype of every rank and, when its time cannot be trusted, why. Empty for a
    failed trial."""

    values: Mapping[str, float] = field(default_factory=dict)
    series: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # logged with steps
    kernels: tuple[str, ...] = ()      # per rank: the attention kernel it ran
    gemm_dtypes: tuple[str, ...] = ()  # per rank: the dtype its matmuls ran in
    unstable: str | None = None        # why the step time cannot be trusted (None: it can)

    @classmethod
    def of(cls, trial: Trial, per_rank: Sequence[RankMeasurement], *, setup_s: float = 0.0,
           run_s: float = 0.0) -> TrialMetrics:
        """Everything the ranks' records say about the trial (no ranks: an empty one)."""
        if not per_rank:
            return cls()
        values = _values(trial.case, per_rank, setup_s, run_s)
        series = {"iter_step_ms": tuple(per_step(per_rank))}
        if per_rank[0].extra.get("losses"):  # a training trial's curve
            series["loss"] = tuple(float(x) for x in per_rank[0].extra["losses"])
        kernels = tuple(m.kernel for m in per_rank)
        return cls(MappingProxyType(values), MappingProxyType(series), kernels,
                   tuple(m.gemm_dtype for m in per_rank),
                   stability.unstable_reason(values, kernels))

    def __getitem__(self, key: str) -> float:
        return self.values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def kernel(self) -> str:
        """The kernel every rank ran, or 'mixed: a, b' (then the trial is unstable)."""
        return _one_of(self.kernels)

    @property
    def gemm_dtype(self) -> str:
        return _one_of(self.gemm_dtypes)

    @property
    def half_width(self) -> float | None:
        """The step time's interval half-width over the median (None without an interval)."""
        return stability.half_width(self.values)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON: infinities and NaNs become null."""
        return finite({**self.values, "kernels": list(self.kernels),
                        "gemm_dtypes": list(self.gemm_dtypes), "unstable": self.unstable})


def _one_of(names: Sequence[str]) -> str:
    distinct = list(dict.fromkeys(n for n in names if n))
    return "" if not distinct else distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(
        distinct)


def finite(value: Any) -> Any:
    """`value` as strict JSON takes it: infinities and NaNs (at any depth) become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
