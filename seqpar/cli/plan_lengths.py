"""`seqpar plan --scope cluster --lengths SPEC`: a step of variable-length sequences under each SP
policy (static packs at each SP degree, dynamic groups), every algorithm, ranked; why the best wins."""

from __future__ import annotations

import json
from typing import Any

from seqpar.cli.display import console, display_table
from seqpar.corpus.cache import lengths_file
from seqpar.errors import require
from seqpar.planner.lengths import Workload
from seqpar.planner.lengths_plan import LengthPlan
from seqpar.planner.lengths_step import (
    GROUP_SIZES,
    PARTS,
    STATES,
    LengthStep,
    why_slower,
)
from seqpar.planner.policy import Filters, split_checkpoint
from seqpar.rules import lengths as length_rules
from seqpar.rules.deal import DEGREES, PACKINGS, POLICIES

SHORT = {"best-fit": "bf", "cost-balanced": "cb", "head-first": "hf", "context-first": "cf",
         "collective-intra": "coll", "p2p-intra": "p2p", "zigzag": "zz", "stripe": "st",
         "balanced": "bal"}


def window_of(mask: str | None) -> int | None:
    """The causal window inside each sequence a --mask gives with --lengths (None: causal); the
    masks defined for one length are refused in one line."""
    if mask is None or mask == "causal":
        return None
    kind, _, rest = mask.partition(":")
    require(kind == "window" and rest.isdigit() and int(rest) >= 1, "mask", mask,
            "with --lengths a mask applies inside each sequence: causal or window:W (a causal "
            "sliding window of W tokens); the other masks are defined for one length")
    return int(rest)


def check_filters(filters: Filters, sp_policy: str | None, packing: str | None,
                  group_sizes: str | None = None, degrees: str | None = None) -> None:
    """What a plan of lengths can search, one line each."""
    require(sp_policy is None or sp_policy in POLICIES, "sp-policy", sp_policy,
            f"must be one of {', '.join(POLICIES)}")
    require(packing is None or packing in PACKINGS, "packing", packing,
            f"must be one of {', '.join(PACKINGS)}")
    require(not (packing == "cost-balanced" and sp_policy == "dynamic"), "packing", packing,
            "cost-balanced packing is a static policy's (dynamic places by cost already)")
    require(group_sizes is None or group_sizes in GROUP_SIZES, "group-sizes", group_sizes,
            f"must be one of {', '.join(GROUP_SIZES)} (the sweep's plan.group_sizes)")
    require(not (group_sizes == "any" and sp_policy == "static"), "group-sizes", group_sizes,
            "sizes the dynamic policy's groups; the static policy runs one SP degree (--sp D)")
    require(degrees is None or degrees in DEGREES, "degrees", degrees,
            f"must be one of {', '.join(DEGREES)} (the sweep's plan.degrees)")
    require(not (degrees == "cost" and sp_policy == "static"), "degrees", degrees,
            "sizes the dynamic policy's groups; the static policy runs one SP degree (--sp D)")
    require(filters.states is None or filters.states in STATES, "states", filters.states,
            "a step of lengths holds its states replicated or FSDP over the pool (dp_sp), or "
            "zero1 (AdamW's moments alone sharded over it)")
    require(not filters.offload, "offload", ",".join(filters.offload or ()),
            "a plan of lengths offloads nothing (none)")
    require(filters.checkpoint is None or split_checkpoint(filters.checkpoint)[0] != "seq-attn",
            "checkpoint", filters.checkpoint, "seq-attn takes one sequence a replica, not lengths")


def plan_lengths(c: Any, model: str, lengths: str, seq_len: int, tokens: int | None,
                 capacity: int | None, world: int, nodes: int, *, kernel: str, dtype: str,
                 filters: Filters, top: int, as_json: bool, mask: str | None,
                 sp_policy: str | None, packing: str | None, batches: int,
                 group_sizes: str | None = None, degrees: str | None = None) -> None:
    window = window_of(mask)
    check_filters(filters, sp_policy, packing, group_sizes, degrees)
    sizes = group_sizes or GROUP_SIZES[0]
    degrees = degrees or DEGREES[0]
    dist = length_rules.parse(lengths, "lengths", corpus=lengths_file)  # corpus: tokenized once
    capacity = capacity if capacity is not None else min(seq_len, dist.high)
    tokens = tokens or world * capacity
    work = Workload(dist, tokens, seq_len, capacity, batches, window=window)
    work.check(world)
    plan = LengthPlan.make(c, model, work, world, nodes, dtype=dtype, kernel=kernel)
    steps = plan.search(filters, (sp_policy,) if sp_policy else POLICIES,
                        (packing,) if packing else PACKINGS, every=top == 0, group_sizes=sizes,
                        degrees=degrees)
    if not steps and plan.unrunnable:  # what the runner refuses: a group size it cannot run
        raise next(iter(plan.unrunnable.values()))
    head = {"cluster": c.name, "memory_gb": c.memory_gb, "scope": "cluster", "model": model,
            "model_params": plan.model_params,
            "kernel": kernel, "kernel_source": plan.kernel_source, "world": world,
            "nodes": nodes, "seq_len": seq_len, "lengths": dist.spec, "tokens_per_step": tokens,
            "capacity": capacity, "batches": batches, "mask": mask or "causal",
            "group_sizes": sizes, "degrees": degrees,
            "skipped": plan.skipped, "dominated": plan.dominated,
            "fitting": sum(s.fits for s in steps)}
    if as_json:
        print(json.dumps({**head, "configs": [s.json() for s in steps]}, indent=1))
        return
    longest = (f"longest {dist.high:,}" if dist.high <= seq_len
               else f"longest {seq_len:,}: --seq-len cuts the {dist.high:,}")
    title = (f"{model}, {dist.spec} ({longest}), {tokens:,} tokens a step, capacity "
             f"{capacity:,} a rank, on {world} GPUs ({nodes} node(s)) of {c.name}, kernel {kernel}"
             + (f", window {window}" if window else ""))
    _table(steps, title, top)
    _why(steps, c)
    console.print(f"kernel rates: {plan.kernel_source}", soft_wrap=False, overflow="fold")
    for err in plan.unrunnable.values():  # the runner refuses such a trial in this line
        console.print(f"not planned: {err}", soft_wrap=False, overflow="fold")
    if plan.skipped:
        why: dict[str, list[str]] = {}
        for split, reason in plan.skipped.items():
            why.setdefault(reason, []).append(split.removeprefix("static sp="))
        console.print("static SP degrees not planned: " + "; ".join(
            f"{', '.join(d)}: {r}" for r, d in why.items()), soft_wrap=False, overflow="fold")


def _label(s: LengthStep) -> str:
    if s.sp_policy == "static":
        return f"static {s.dp}x{s.sp} {SHORT[s.split.packing]}"
    return ("dynamic" + (" eq" if s.split.equal_counts else "")
            + (" any" if s.split.any_size else "")
            + (" cost" if s.split.degrees == "cost" else "") + " "
            + "/".join(str(d) for d in s.degrees))


def _options(s: LengthStep) -> str:
    shown = [f"{k}={SHORT.get(str(v), v)}" for k, v in s.options.items()
             if k != "dcp" and v is not None] + ([s.linear_sp] if s.linear_sp else [])
    return " ".join(shown + ([f"(+{len(s.alternatives)} alike)"] if s.alternatives else []))


def _table(steps: list[LengthStep], title: str, top: int) -> None:
    fitting = [s for s in steps if s.fits]
    best = fitting[0] if fitting else None
    rows, shown = [], steps[:top] if top else steps
    for i, s in enumerate(shown):
        where = "/".join(f"{100 * s.parts[k] / s.step_ms:.0f}" for k in PARTS)
        rows.append([i + 1 if s.fits else "-", _label(s), s.algorithm, _options(s),
                     SHORT.get(s.layout, s.layout), s.policy.label(), f"{s.step_ms:,.1f}",
                     f"{s.tgs:,.0f}", f"{s.peak_mem_bytes / 1e9:.1f}", f"{s.imbalance:.2f}",
                     where, why_slower(s, best) if best else why_slower(s, s)])
    display_table(title, ["#", "SP policy", "algorithm", "options", "layout", "policy",
                          "step\nms", "TGS", "mem\nGB", "imbal\nFLOPs",
                          "at/ac/oc/rc/id/cm/op/ho\n% of step", "vs #1"],
                  rows, highlight_row=0, compact=True,
                  wrap=("SP policy", "options", "policy", "vs #1"))
    console.print("SP policy: static DPxSP bf (best-fit packs) | cb (cost-balanced, WLB-LLM); "
                  "dynamic (the group sizes it uses; any: groups of any size, --group-sizes any; "
                  "eq: equal micro-batch counts, FSDP's; "
                  "replicated and zero1 states need none). Step "
                  "parts: at attention kernels, ac its exposed communication, oc other compute, rc "
                  "recompute, id idle (waiting on the slowest rank: the imbalance), cm FSDP past "
                  "the rounds, the gradient all-reduce and zero1's broadcast, op optimizer, ho the "
                  "host's issue the device does not hide (vs #1 says host-bound where ho is the "
                  "step's largest part: the host sets the pace). "
                  "imbal: max / mean attention FLOPs over ranks (the runner's load_imbalance)"
                  + (". Options: lasp2|lasp1 how the linear layers pass their states (the step's "
                     "faster)" if any(s.linear_sp for s in shown) else ""))


def _why(steps: list[LengthStep], c: Any) -> None:
    """The best step's parts and, against the best of each other SP policy, what differs."""
    fitting = [s for s in steps if s.fits]
    if not fitting:
        least = min(steps, key=lambda s: s.peak_mem_bytes) if steps else None
        console.print(f"nothing fits in {c.memory_gb:g} GB a GPU"
                      + (f"; the least memory found is {least.peak_mem_bytes / 1e9:.1f} GB: "
                         f"{_label(least)} {least.algorithm} {least.policy.label()} (lower "
                         "--capacity)" if least else ""), soft_wrap=False, overflow="fold")
        return
    best = fitting[0]
    parts = ", ".join(f"{k} {v:,.1f}" for k, v in best.parts.items() if v >= 0.05)
    console.print(f"best: {_label(best)} {best.algorithm} {best.policy.label()}: "
                  f"{best.step_ms:,.1f} ms = {parts} ms; imbalance {best.imbalance:.3f} (FLOPs), "
                  f"{best.busy_imbalance:.3f} (busy time); the deal's gap to its bound "
                  f"{best.gap:.3f}", soft_wrap=False, overflow="fold")
    seen = {_kind(best)}
    for s in fitting[1:]:
        if _kind(s) in seen:
            continue
        seen.add(_kind(s))
        diff = sorted(((s.parts[k] - best.parts[k], k) for k in PARTS), reverse=True)
        grew = ", ".join(f"{k} {d:+,.1f}" for d, k in diff if abs(d) >= 0.05)
        console.print(f"  vs best {_kind(s)} ({s.algorithm}): {s.step_ms / best.step_ms:.3f}x "
                      "the step" + (f" ({grew} ms)" if grew else ", part for part"),
                      soft_wrap=False, overflow="fold")


def _kind(s: LengthStep) -> str:
    if s.sp_policy == "static":
        return f"static {s.split.packing}"
    return "dynamic" + (" equal counts" if s.split.equal_counts else "") + (
        " any size" if s.split.any_size else "")
