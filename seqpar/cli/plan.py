"""`seqpar plan`: every valid configuration ranked by the performance model on a cluster."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from seqpar.cli.display import console, display_table
from seqpar.cli.plan_lengths import plan_lengths
from seqpar.cli.plan_validate import validate as _validate
from seqpar.errors import require
from seqpar.planner import clusters, pins
from seqpar.planner import plan as perf_plan
from seqpar.planner.maxseq import max_seq
from seqpar.planner.policy import Filters
from seqpar.planner.search import (
    check_counts,
    make_setup,
    offload_names,
    search,
    why_slower,
    with_alternatives,
)
from seqpar.planner.step import PARTS
from seqpar.rules import algorithms, masks
from seqpar.rules.grids import ranks_per_node_of
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.pool import AUTO

Opt = typer.Option


def plan(
    cluster: Annotated[str, Opt("--cluster", help="A cluster preset (h100-sxm, h200-sxm, "
                                "loongtrain-a100, burst-a800, ..., local) or a YAML file.")] = "local",
    model: Annotated[str, Opt("--model", help="A model preset (llama3.1-8b, llama3.1-70b, "
                              "qwen2.5-14b, llama2-7b, ...), a YAML of ModelConfig's fields or a "
                              "Hugging Face config.json.")] = "llama2-7b",
    seq_len: Annotated[int, Opt("--seq-len", help="Tokens in a sequence (with --lengths: the "
                                "longest a step may hold).")] = 131072,
    world: Annotated[int, Opt("--world", "-P", help="Ranks: the SP group (attention, model "
                              "scope) or all GPUs, DP x SP (cluster scope).")] = 8,
    nodes: Annotated[int | None, Opt(
        "--nodes", help="Nodes the ranks span (default: world / GPUs per node).")] = None,
    scope: Annotated[str, Opt(help="attention (one layer fwd+bwd) | model (a step of one SP "
                              "group) | cluster (the DP x SP split of --world)")] = "attention",
    tokens_per_step: Annotated[int | None, Opt(
        "--tokens-per-step", help="Tokens a step trains on, all ranks together (cluster scope; "
        "default: one sequence per data-parallel replica, whatever the split).")] = None,
    kernel: Annotated[str, Opt(help="The attention kernel: flash2 | flash3 | sdpa-flash | "
                               "sdpa-cudnn | sdpa-efficient.")] = "flash2",
    dtype: Annotated[str, Opt(help="bfloat16 | float32 | ...")] = "bfloat16",
    mask: Annotated[str | None, Opt("--mask", help="Any attention mask, as a compact form: full, "
                                    "causal (the default), window:W[:full], "
                                    "documents:L1,L2,..., block_sparse:BLOCK:DENSITY[:SEED], "
                                    "dilated:BLOCK:STRIDE, prefix_lm:P, shared_question:Q:A1,..., "
                                    "slices:... (README: Any mask).")] = None,
    sp: Annotated[int | None, Opt("--sp", help="Only this SP degree (cluster scope).")] = None,
    algorithm: Annotated[str | None, Opt("--algorithm", help="Only this algorithm.")] = None,
    layout: Annotated[str | None, Opt("--layout", help="Only this layout.")] = None,
    option: Annotated[list[str] | None, Opt(
        "--option", help="Pin an algorithm option, KEY=VALUE, repeatable: dhp, dcp, inner_ring, "
        "placement (usp: head-first | context-first; wallfacer: collective-intra | p2p-intra), "
        "team_size, ranks_per_node; a partial pin resolves the rest (dhp=4 at P=32: dcp=8).")
    ] = None,
    states: Annotated[str | None, Opt(help="Only: dp_sp | sp | node | replicated | zero1 (model "
                                      "states sharded over every rank, the SP group, a node, or "
                                      "nowhere; zero1: AdamW's moments alone over every rank, "
                                      "ZeRO-1).")] = None,
    checkpoint: Annotated[str | None, Opt(help="Only: none | full | sc++ | seq:F | sc++,seq:F | "
                                          "seq-attn:F (BurstEngine's sequence-level selective "
                                          "checkpointing, prefix F).")] = None,
    fused_head: Annotated[bool | None, Opt("--fused-head/--no-fused-head", help="Only with / "
                                           "without the fused LM head.")] = None,
    offload: Annotated[str | None, Opt(help="Only this offload: none, or a comma list of "
                                       "optimizer, params, activations.")] = None,
    tiled: Annotated[bool | None, Opt("--tiled/--no-tiled", help="Only with / without the "
                                      "tiled MLP and loss.")] = None,
    top: Annotated[int, Opt("--top", help="Rows in the table (0: every configuration: an "
                            "exhaustive search, the dominated ones listed too, marked, in "
                            "--json).")] = 20,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
    validate: Annotated[str | None, Opt(
        "--validate", help="A finished sweep's id: predicted vs measured per trial.")] = None,
    max_seq: Annotated[bool, Opt(
        "--max-seq", help="Per configuration, the longest sequence that fits in the device's "
        "memory (--seq-len is ignored).")] = False,
    lengths: Annotated[str | None, Opt(
        "--lengths", help="A step of variable-length sequences (cluster scope): fixed:N | "
        "lognormal:mean=M,sigma=S,min=A,max=B | file:PATH | text:PATH (docs/planner.md).")] = None,
    capacity: Annotated[int | None, Opt(
        "--capacity", help="With --lengths: tokens a rank holds in a micro-batch (default: the "
        "longest sequence, at most --seq-len).")] = None,
    sp_policy: Annotated[str | None, Opt(
        "--sp-policy", help="With --lengths: only static (one SP degree, packs) or dynamic (each "
        "sequence on the smallest group that holds it).")] = None,
    packing: Annotated[str | None, Opt(
        "--packing", help="With --lengths: only best-fit or cost-balanced static packs.")] = None,
    batches: Annotated[int, Opt(
        "--batches", help="With --lengths: seeded batches dealt and timed (the mean).")] = 2,
    group_sizes: Annotated[str | None, Opt(
        "--group-sizes", help="With --lengths: the dynamic policy's groups, power-of-two "
        "(Megatron-LM's, the default) or any (ByteScale's), as the sweep's plan.group_sizes."
    )] = None,
    degrees: Annotated[str | None, Opt(
        "--degrees", help="With --lengths: the dynamic policy's group sizes, smallest (each "
        "sequence on the smallest group that holds it, the default) or cost (larger groups "
        "where the step's predicted makespan falls), as the sweep's plan.degrees.")] = None,
) -> None:
    """Rank every valid configuration by predicted time or tokens per GPU per second; the
    longest sequence each fits (--max-seq); or --validate a finished sweep."""

    require(scope in ("attention", "model", "cluster"), "scope", scope,
            "must be attention, model or cluster")
    require(top >= 0, "top", top, "must be 0 (all) or more")
    c = clusters.load(cluster)
    if validate is not None:
        _validate(validate, c, as_json)
        return
    check_counts(seq_len=seq_len, world=world, batches=batches,
                 **({"nodes": nodes} if nodes is not None else {}))
    if lengths is None:
        given = next((f"--{k.replace('_', '-')}" for k, v in (("capacity", capacity), (
            "sp_policy", sp_policy), ("packing", packing), ("batches", batches != 2),
            ("group_sizes", group_sizes), ("degrees", degrees)) if v), None)
        require(given is None, given or "", True, "needs --lengths (a step of variable-length "
                "sequences)")
    else:
        require(scope == "cluster", "scope", scope, "--lengths plans a step of the whole pool: "
                "use --scope cluster (--sp D plans one static SP degree)")
        require(not max_seq, "max-seq", True, "finds the longest single sequence; with "
                "--lengths, --seq-len is the longest a step holds and --capacity what a rank "
                "holds")
    require(algorithm != AUTO or (lengths is not None and sp_policy != "static"), "algorithm",
            algorithm, "chooses an algorithm per group size of the dynamic policy: needs "
            "--lengths (and not --sp-policy static)")
    if mask is not None and lengths is None:
        require(not max_seq, "mask", mask, "--max-seq plans plain causal attention (a mask "
                "is of one length)")
        masks.parse(mask, seq_len)  # a bad mask: one line, before any search
    nodes = nodes or max(1, -(-world // c.gpus_per_node))
    ranks_per_node_of(world, nodes, None)  # nodes divide the world: the one rule
    filters = Filters(sp=sp, algorithm=algorithm, layout=layout, states=states,
                      checkpoint=checkpoint, fused_head=fused_head, tiled=tiled,
                      offload=None if offload is None else offload_names(offload),
                      options=pins.parse(option))
    names = [n for n in algorithms.REGISTRY if algorithm is None or n == algorithm]
    if scope == "cluster":
        worlds = [s for s in range(1, world + 1) if world % s == 0 and (sp is None or s == sp)]
        if algorithm != AUTO:
            pins.check([n for n in names if n != "local"], [w for w in worlds if w > 1] or worlds,
                       filters.options)
        if lengths is not None:
            check_counts(**({"capacity": capacity} if capacity is not None else {}),
                         **({"tokens_per_step": tokens_per_step} if tokens_per_step else {}))
            plan_lengths(c, model, lengths, seq_len, tokens_per_step, capacity, world, nodes,
                         kernel=kernel, dtype=dtype, filters=filters, top=top, as_json=as_json,
                         mask=mask, sp_policy=sp_policy, packing=packing, batches=batches,
                         group_sizes=group_sizes, degrees=degrees)
            return
        _cluster(c, model, seq_len, tokens_per_step, world, nodes, kernel, dtype, filters, top,
                 as_json, mask)
        return

    names = [n for n in names if (n == "local") == (world == 1)]
    pins.check(names, [world], filters.options)
    space = pins.space(names, world, filters.options)
    layouts = (layout,) if layout else LAYOUTS
    if max_seq:
        _max_seq(c, model, world, space, nodes, scope, dtype, top, as_json, filters, layouts)
        return
    if scope == "model":
        result = perf_plan.model_search(c, model, seq_len, world, space, nodes=nodes, dtype=dtype,
                                        kernel=kernel, filters=filters, layouts=layouts,
                                        mask=mask, every=top == 0)
        seen = f", mask {mask}" if mask else ""
        _steps(result.ranked, f"{model} N={seq_len:,} P={world} on {c.name} ({nodes} node(s)), "
               f"scope model, kernel {kernel}{seen}", c, top, as_json,
               {"scope": "model", "kernel": kernel, "mask": mask or "causal", "world": world,
                "nodes": nodes, "dominated": result.dominated, "too_big": result.too_big},
               result)
        return
    ranked = perf_plan.rank(c, model, seq_len, world, space, nodes=nodes, scope=scope,
                            dtype=dtype, kernel=kernel, filters=filters, layouts=layouts,
                            mask=mask)
    _attention(ranked, c, model, seq_len, world, nodes, top, as_json, kernel, mask)


def _cluster(c, model: str, seq_len: int, tokens: int | None, world: int, nodes: int,
             kernel: str, dtype: str, filters, top: int, as_json: bool,
             mask: str | None = None) -> None:

    setup = make_setup(c, model, seq_len, tokens, world, nodes, kernel=kernel, dtype=dtype,
                       mask=mask)
    result = search(setup, filters, keep=top or None, every=top == 0)
    head = {"scope": "cluster", "model": model, "kernel": kernel, "kernel_source":
            setup.kernel_source, "world": world, "nodes": nodes, "seq_len": seq_len,
            "tokens_per_step": tokens, "mask": mask or "causal",
            "splits": [{"dp": d, "sp": s, "micro_batches": m} for d, s, m in result.splits],
            "searched": result.searched, "dominated": result.dominated,
            "too_big": result.too_big, "bounded": result.bounded}
    per_step = f"{tokens:,} tokens a step" if tokens else "one sequence per DP replica a step"
    title = (f"{model} N={seq_len:,}, {per_step} on {world} GPUs ({nodes} node(s)) "
             f"of {c.name}, kernel {kernel}" + (f", mask {mask}" if mask else ""))
    _steps(result.ranked, title, c, top, as_json, head, result)
    if not as_json:
        console.print(f"kernel rates: {setup.kernel_source}", soft_wrap=False, overflow="fold")
        console.print(f"{result.searched} configurations timed over {len(result.splits)} DP x SP "
                      f"split(s); not timed: {result.dominated} dominated attention "
                      f"configurations, {result.too_big} that fit under no policy, "
                      f"{result.bounded} that cannot reach the top {top}")


def _steps(steps: list, title: str, c, top: int, as_json: bool, head: dict[str, Any],
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
    best = fitting[0]
    rows = []
    kept = [s for s in steps if s.dominated_by is None]
    shown = _fold(kept)
    for i, s in enumerate(shown[:top] if top else shown):
        options, layouts = _describe(with_alternatives(result, s) if result else [s])
        p = s.parts
        where = "/".join(f"{100 * p[k] / s.step_ms:.0f}" for k in PARTS)
        rows.append([i + 1 if s.fits else "-", f"{s.dp}x{s.sp}", s.algorithm, options, layouts,
                     s.policy.label(), f"{s.step_ms / 1e3:.2f}", f"{s.tgs:,.0f}",
                     f"{s.peak_mem_bytes / 1e9:.1f}", where, why_slower(s, best)])
    display_table(title, ["#", "dp x\nsp", "algorithm", "options", "layout", "policy", "step\ns",
                          "TGS", "mem\nGB", "at/ac/oc/rc/cm/op/ho\n% of step", "vs #1"],
                  rows, highlight_row=0, compact=True, wrap=("options", "layout", "policy", "vs #1"))
    dominated = len(steps) - len(kept)
    console.print(f"{len(fitting)} of {len(steps)} timed configurations fit in {c.name}'s "
                  f"{c.memory_gb:g} GB (1e9 bytes) a GPU ({len(kept) - len(shown)} folded into a "
                  "row of the same step time and less memory"
                  + (f"; {dominated} dominated: a listed one beats each on everything a step "
                     "depends on" if dominated else "") + "; --json lists each). Step parts: at "
                  "attention kernels, ac the attention's exposed communication, oc other compute, "
                  "rc recompute, cm other exposed communication (FSDP, DP, zero1), op optimizer, ho "
                  "the host's issue the device does not hide (host-bound: it sets the pace). "
                  "Policy: +fh fused head, off: offloaded optimizer/params/activations, +tile "
                  "tiled MLP and loss")


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


def _fold(steps: list) -> list:
    """The steps with each group of one configuration but for its policy and one step time kept
    as its least-memory member (the first of the group keeps its place)."""
    kept: dict[tuple, int] = {}
    out: list = []
    for s in steps:
        key = (s.fits, s.dp, s.sp, s.algorithm, json.dumps(s.options, sort_keys=True), s.layout,
               f"{s.step_ms:.6g}")
        if key not in kept:
            kept[key] = len(out)
            out.append(s)
        elif s.peak_mem_bytes < out[kept[key]].peak_mem_bytes:
            out[kept[key]] = s
    return out


def _attention(ranked: list, c, model: str, seq_len: int, world: int, nodes: int, top: int,
               as_json: bool, kernel: str, mask: str | None = None) -> None:

    if as_json:
        print(json.dumps({"cluster": c.name, "kernel": kernel, "mask": mask or "causal",
                          "configs": [p.json() for p in ranked]}, indent=1))
        return
    groups = perf_plan.equivalents(ranked)
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


def _max_seq(c, model: str, world: int, space: list, nodes: int, scope: str, dtype: str,
             top: int, as_json: bool, filters, layouts) -> None:

    found = max_seq(c, model, world, space, nodes=nodes, scope=scope, dtype=dtype,
                    filters=filters, layouts=layouts)
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
