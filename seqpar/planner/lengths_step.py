"""What a plan of lengths ranks: how a step's sequences are dealt (`Split`) and one configuration's
predicted step (`LengthStep`: its parts, imbalance, degrees; `why_slower`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqpar.planner.policy import Policy
from seqpar.planner.why import why_slower as _why

PARTS = ("attention", "attention_comm", "other_compute", "recompute", "idle", "exposed_comm",
         "optimizer", "host")
# what the runner's step of lengths holds: replicated, FSDP over the pool, or zero1 (the moments
# alone sharded over it: no per-layer gathers, so no equal micro-batch counts needed)
STATES = ("replicated", "dp_sp", "zero1", "dist-opt")  # dist-opt: gathered once a step
# the dynamic policy's group sizes, the sweep's words (`plan.group_sizes`): powers of two and the
# pool (Megatron-LM's rule), or any size from 1 to the pool (ByteScale's)
GROUP_SIZES = ("power-of-two", "any")


@dataclass(frozen=True)
class Split:
    """How a step's sequences are dealt: `static` at SP degree `degree` with `packing`, or
    `dynamic` (with `equal_counts`: every rank as many micro-batches, what FSDP needs; with
    `any_size`: groups of any size, else powers of two and the pool; `degrees`: each sequence on
    the smallest group that holds it, or sizes by the predicted makespan, `rules.deal`)."""

    policy: str
    degree: int | None = None
    packing: str = "best-fit"
    equal_counts: bool = False
    any_size: bool = False
    degrees: str = "smallest"  # the dynamic policy's sizes: the smallest that holds, or by cost

    @property
    def group_sizes(self) -> str | None:
        """The dynamic policy's group sizes in the sweep's words (None: static)."""
        return None if self.policy == "static" else GROUP_SIZES[self.any_size]

    def label(self) -> str:
        if self.policy == "static":
            return f"static sp={self.degree} {self.packing}"
        return "dynamic" + (" equal" if self.equal_counts else "") + (
            " any" if self.any_size else "") + (" cost" if self.degrees == "cost" else "")


@dataclass
class LengthStep:
    """One configuration's predicted step of the distribution (the mean over the batches)."""

    split: Split
    algorithm: str
    options: dict[str, Any]                       # as a trial asks for them (its largest group)
    by_size: dict[int, tuple[str, dict[str, Any]]]  # what each group size runs
    layout: str
    policy: Policy
    capacity: int
    world: int
    kernel: str
    step_ms: float
    tgs: float
    mfu: float
    mfu_unmasked_attention: float
    hfu: float
    imbalance: float        # max / mean attention FLOPs over ranks (the runner's load_imbalance)
    busy_imbalance: float   # max / mean busy seconds over ranks
    gap: float              # the deal's makespan over its lower bound (its own cost model)
    micro_batches: float    # per rank, the mean
    degrees: dict[int, float]  # group size -> sequences a step (the mean over the batches)
    peak_mem_bytes: int
    fits: bool
    parts: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    # the configurations with the same rates at every size (a layout or an option that changes
    # nothing here): (options, layout) of each
    alternatives: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    host_bound: bool = False  # the host's issuing sets the step's pace (`planner.host`)
    mla_pass: str | None = None  # an MLA ring carries kv or the latent (the largest group)
    linear_sp: str | None = None  # a hybrid's linear layers pass their states: lasp2 | lasp1

    @property
    def sp_policy(self) -> str:
        return self.split.policy

    @property
    def dp(self) -> int:
        return self.world // self.split.degree if self.split.degree else 1

    @property
    def sp(self) -> int:
        return self.split.degree or self.world

    def json(self) -> dict[str, Any]:
        return {"sp_policy": self.sp_policy, "packing": self.split.packing,
                "capacity": self.capacity, "equal_counts": self.split.equal_counts,
                "group_sizes": self.split.group_sizes,
                "degrees": None if self.split.policy == "static" else self.split.degrees,
                "dp": self.dp, "sp": self.sp, "algorithm": self.algorithm,
                "options": self.options, "layout": self.layout,
                "options_by_size": {str(d): {"algorithm": n, "options": o}
                                    for d, (n, o) in sorted(self.by_size.items())},
                **self.policy.fields(), "kernel": self.kernel,
                **({"mla_pass": self.mla_pass} if self.mla_pass else {}),
                **({"linear_sp": self.linear_sp} if self.linear_sp else {}),
                "micro_batches": round(self.micro_batches, 2),
                "predicted": {"step_ms": round(self.step_ms, 3), "tgs": round(self.tgs, 2),
                              "mfu": round(self.mfu, 4),
                              "mfu_unmasked_attention": round(self.mfu_unmasked_attention, 4),
                              "hfu": round(self.hfu, 4), "imbalance": round(self.imbalance, 4),
                              "busy_imbalance": round(self.busy_imbalance, 4),
                              "gap": round(self.gap, 4),
                              "degrees": {str(d): n for d, n in self.degrees.items()},
                              "peak_mem_bytes": self.peak_mem_bytes,
                              "parts_ms": {k: round(v, 3) for k, v in self.parts.items()},
                              "host_bound": self.host_bound, "memory": self.memory},
                "fits": self.fits}


def why_slower(s: LengthStep, best: LengthStep) -> str:
    """Why `s` loses to `best` (`perf.why`), the grown part in ms."""
    return _why(s, best, unit="ms")
