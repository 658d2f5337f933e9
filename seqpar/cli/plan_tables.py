"""`seqpar plan`'s tables of fixed-length plans: whole steps (model and cluster scope), one
attention layer, the longest sequence each configuration fits; or the same as JSON."""

from __future__ import annotations

import json
from typing import Any

from seqpar.cli.display import console, display_table
from seqpar.planner import scopes
from seqpar.planner.search import why_slower, with_alternatives
from seqpar.planner.step import PARTS
from seqpar.rules.layouts import LAYOUTS


def steps_table(steps: list, title: str, c, top: int, as_json: bool, head: dict[str, Any],
                result: Any = None) -> None:
    """Whole-step predictions: a table (where the time goes, why each lower row loses) or JSON
    (every configuration; with --top 0 the dominated ones too, each marked `dominated_by`)."""

    fitting = [s for s in steps if s.fits]
    if as_json:
        print(json.dumps({"cluster": c.name, "memory_gb": c.memory_gb,
                          "host_memory_gb": c.host_memory_gb, **head,
                          "fitting": len(fitting), "configs": [s.json() for s in steps]},
                         indent=1))
        return
    if not fitting:
        per_node = head.get("world", steps[0].dp * steps[0].sp if steps else 1) // head.get(
            "nodes", 1)
        console.print(nothing_fits(steps, c, title, result, max(1, per_node)), soft_wrap=False,
                      overflow="fold")
        return
    rows = []
    ep = any(s.policy.ep > 1 for s in steps)  # the EP all-to-alls' part, where any has them
    parts = PARTS if ep else tuple(k for k in PARTS if k != "ep_comm")
    kept = [s for s in steps if s.dominated_by is None]
    shown = _fold(kept)
    best = next((s for s in shown if s.fits), fitting[0])  # row 1: a fold keeps its least memory
    for i, s in enumerate(shown[:top] if top else shown):
        options, layouts = _describe(with_alternatives(result, s) if result else [s])
        options = " ".join(x for x in (options, *_kinds_passes(s)) if x)
        p = s.parts
        where = "/".join(f"{100 * p[k] / s.step_ms:.0f}" for k in parts)
        rows.append([i + 1 if s.fits else "-", f"{s.dp}x{s.sp}", s.algorithm, options, layouts,
                     s.policy.label(), f"{s.step_ms / 1e3:.2f}", f"{s.tgs:,.0f}",
                     f"{s.peak_mem_bytes / 1e9:.1f}", where, why_slower(s, best)])
    display_table(title, ["#", "dp x\nsp", "algorithm", "options", "layout", "policy", "step\ns",
                          "TGS", "mem\nGB", "at/ac/oc/rc/cm/op/ho" + ("/ep" if ep else "")
                          + "\n% of step", "vs #1"],
                  rows, highlight_row=0, compact=True, wrap=("options", "layout", "policy", "vs #1"))
    dominated = len(steps) - len(kept)
    console.print(f"{len(fitting)} of {len(steps)} timed configurations fit in {c.name}'s "
                  f"{c.memory_gb:g} GB (1e9 bytes) a GPU ({len(kept) - len(shown)} folded into a "
                  "row of the same step time and less memory"
                  + (f"; {dominated} dominated: a listed one beats each on everything a step "
                     "depends on" if dominated else "") + "; --json lists each). Step parts: at "
                  "attention kernels, ac the attention's exposed communication, oc other compute, "
                  "rc recompute, cm other exposed communication (FSDP, DP, zero1), op optimizer, ho "
                  "the host's issue the device does not hide (vs #1 says host-bound where ho is the "
                  "step's largest part: the host sets the pace)"
                  + (", ep the expert-parallel all-to-alls" if ep else "") + ". "
                  "Policy: +fh fused head, off: offloaded optimizer/params/activations, +tile "
                  "tiled MLP and loss" + (", epN experts over EP groups of N ranks" if ep else "")
                  + (". Options: kv|latent what an MLA ring carries, lasp2|lasp1 how the linear "
                     "layers pass their states" if any(_kinds_passes(s) for s in shown) else ""))


def nothing_fits(steps: list, c, title: str, result: Any = None, per_node: int = 1) -> str:
    """Why no configuration fits, in one unit (GB, 1e9 bytes): the limit hit (the device's memory,
    or a node's host memory for what it offloads) and the configuration that came closest."""
    device = f"{c.memory_gb:g} GB (1e9 bytes) of device memory a GPU on {c.name}"
    if steps:
        s = min(steps, key=lambda s: s.peak_mem_bytes)
        label = f"dp={s.dp} sp={s.sp} {s.algorithm} {s.policy.label()}"
        if s.peak_mem_bytes <= c.memory_gb * 1e9 and c.host_memory_gb is not None:
            host = s.memory.get("host", 0) * per_node / 1e9
            return (f"nothing fits in the {c.host_memory_gb:g} GB of host memory a node on "
                    f"{c.name} (what its GPUs offload): {title}; the least that fits the device "
                    f"offloads {host:.1f} GB a node: {label}")
        return (f"nothing fits in the {device}: {title}; the least memory found is "
                f"{s.peak_mem_bytes / 1e9:.1f} GB: {label}")
    if result is not None and result.closest is not None:
        return (f"nothing fits in the {device}: {title}; the least memory found is "
                f"{result.closest[0] / 1e9:.1f} GB: {result.closest[1]}")
    return (f"no valid configuration: {title} (the filters --algorithm, --layout, --checkpoint and "
            "--option leave none the algorithms' rules accept; seq-attn:F needs ring, burst or "
            "local over stripe, or zigzag at F = 0.5)")


def _kinds_passes(s: Any) -> tuple[str, ...]:
    """What a step's MLA ring carries (`kv` or `latent`) and its linear layers' SP (`lasp2` or
    `lasp1`), where the model has them: part of the configuration's name."""
    return tuple(x for x in (getattr(s.attention, "mla_pass", None), s.linear_sp) if x)


def _fold(steps: list) -> list:
    """The steps with each group of one configuration but for its policy and one step time kept
    as its least-memory member (the first of the group keeps its place)."""
    kept: dict[tuple, int] = {}
    out: list = []
    for s in steps:
        key = (s.fits, s.dp, s.sp, s.algorithm, json.dumps(s.options, sort_keys=True), s.layout,
               _kinds_passes(s), f"{s.step_ms:.6g}")
        if key not in kept:
            kept[key] = len(out)
            out.append(s)
        elif s.peak_mem_bytes < out[kept[key]].peak_mem_bytes:
            out[kept[key]] = s
    return out


def attention_table(ranked: list, c, model: str, seq_len: int, world: int, nodes: int, top: int,
                    as_json: bool, kernel: str, mask: str | None = None,
                    model_params: dict[str, int] | None = None) -> None:

    if as_json:
        print(json.dumps({"cluster": c.name, "kernel": kernel, "mask": mask or "causal",
                          "model_params": model_params,
                          "configs": [p.json() for p in ranked]}, indent=1))
        return
    groups = scopes.equivalents(ranked)
    rows = []
    for i, group in enumerate(groups[:top] if top else groups):
        p = group[0]
        options, layouts = _describe(group)
        rows.append([i + 1 if p.fits else "no fit", p.algorithm, options, layouts,
                     f"{p.attention_ms:.2f}", f"{p.compute_ms:.2f}", f"{p.exposed_ms['intra']:.2f}",
                     f"{p.exposed_ms['inter']:.2f}", f"{p.bytes_intra / 1e6:.1f}",
                     f"{p.bytes_inter / 1e6:.1f}", f"{p.peak_mem_bytes / 1e9:.2f}",
                     p.bottleneck.replace(" communication", "")])
    display_table(f"{model} N={seq_len} P={world} on {c.name} ({nodes} node(s)), scope attention, "
                  f"kernel {kernel}" + (f", mask {mask}" if mask else ""),
                  ["#", "algorithm", "options", "layout", "attn\nms", "compute\nms",
                   "exposed\nintra ms", "exposed\ninter ms", "MB\nintra", "MB\ninter", "mem\nGB",
                   "bound"], rows, highlight_row=0, compact=True, wrap=("options", "layout"))
    unfit = sum(not p.fits for p in ranked)
    console.print(f"{len(ranked)} configurations in {len(groups)} rows (a row: configurations "
                  f"with identical predictions; --json lists each), {unfit} do not fit in "
                  f"{c.memory_gb:g} GB")


def max_seq_table(found: list, c, model: str, world: int, nodes: int, scope: str, top: int,
                  as_json: bool) -> None:
    """Per configuration (and policy), the longest sequence that fits."""
    if as_json:
        print(json.dumps({"cluster": c.name, "memory_gb": c.memory_gb,
                          "configs": [r.json() for r in found]}, indent=1))
        return
    groups: dict[tuple, list] = {}
    for r in found:
        groups.setdefault((r.algorithm, r.max_tokens, r.peak_mem_bytes,
                           r.policy.label() if r.policy else ""), []).append(r)
    rows = []
    for i, group in enumerate(list(groups.values())[:top] if top else groups.values()):
        r = group[0]
        options, lays = _describe(group)
        rows.append([i + 1, r.algorithm, options, lays, r.policy.label() if r.policy else "-",
                     f"{r.max_tokens:,}" if r.max_tokens else "none fits",
                     f"{r.max_tokens / 2**20:.2f}M" if r.max_tokens else "-",
                     f"{r.peak_mem_bytes / 1e9:.2f}"])
    display_table(f"longest sequence that fits: {model} P={world} on {c.name} ({nodes} node(s), "
                  f"{c.memory_gb:g} GB), scope {scope}",
                  ["#", "algorithm", "options", "layout", "policy", "max tokens", "Mi tokens",
                   "mem GB at it"], rows,
                  highlight_row=0, compact=True, wrap=("options", "layout", "policy"))
    console.print(f"{len(found)} configurations in {len(groups)} rows; lengths are multiples of "
                  "each configuration's granularity (--json)")


SHORT = {"head-first": "hf", "context-first": "cf", "collective-intra": "coll",
         "p2p-intra": "p2p", "contiguous": "contig", "zigzag": "zz", "stripe": "st",
         "balanced": "bal"}
KEYS = {"inner_ring": "ring", "team_size": "C", "placement": ""}


def _describe(group: list) -> tuple[str, str]:
    """(options, layouts) of configurations with identical predictions: each option's values
    joined by '|' (with how many configurations when they are not every combination)."""
    configs = [{**{k: v for k, v in p.options.items() if k != "dcp" and v is not None},
                "layout": p.layout} for p in group]
    values: dict[str, list] = {}
    for c in configs:
        for k, v in c.items():
            values.setdefault(k, [])
            if v not in values[k]:
                values[k].append(v)
    combinations = 1
    for v in values.values():
        combinations *= len(v)
    layouts = values.pop("layout")
    opts = " ".join(_option(k, v) for k, v in values.items())
    if combinations != len(configs):
        opts += f" ({len(configs)} of these)"
    shown = "any" if set(layouts) == set(LAYOUTS) else "|".join(SHORT.get(x, x) for x in layouts)
    return opts, shown


def _option(key: str, values: list) -> str:
    text = "|".join(str(SHORT.get(v, v)) for v in values)
    name = KEYS.get(key, key)
    return f"{name}={text}" if name else text
