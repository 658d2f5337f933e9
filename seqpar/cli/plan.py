"""`seqpar plan`: every valid configuration ranked by the performance model on a cluster; the
question its flags ask can be saved to a file and asked again (`plan_file`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.models import OptionInfo

from seqpar.cli.display import console, err_console
from seqpar.cli.plan_file import FILE_PANEL, PANELS, Question, question, write
from seqpar.cli.plan_tables import attention_table, max_seq_table, steps_table
from seqpar.errors import require
from seqpar.planner import clusters, pins, scopes
from seqpar.planner.ep import check_filters
from seqpar.planner.lengths_step import GROUP_SIZES
from seqpar.planner.maxseq import max_seq
from seqpar.planner.policy import Filters
from seqpar.planner.search import check_counts, make_setup, offload_names, search
from seqpar.rules import algorithms, masks
from seqpar.rules.grids import ranks_per_node_of
from seqpar.rules.layouts import LAYOUTS
from seqpar.rules.pool import AUTO

DATA, CLUSTER, SEARCH, SHOW = PANELS
# --degrees' default, rules.deal.DEGREES[0] (plan_lengths checks any --degrees against DEGREES):
# the deal's rules are the lengths', imported only by a plan of lengths
SMALLEST = "smallest"


def _opt(*names: str, panel: str, help: str, **more: Any) -> OptionInfo:
    return typer.Option(*names, help=help, rich_help_panel=panel, **more)


def plan(
    ctx: typer.Context,
    file: Annotated[str | None, typer.Argument(
        help="A plan file (--save's): ask its question again.", show_default=False,
        metavar="FILE")] = None,
    model: Annotated[str, _opt("--model", panel=DATA, help="A preset (llama3.1-8b, ...), a YAML "
                               "or a config.json.")] = "llama2-7b",
    seq_len: Annotated[int, _opt("--seq-len", panel=DATA, help="Tokens a sequence (with "
                                 "--lengths: the longest a step holds).")] = 131072,
    mask: Annotated[str, _opt("--mask", panel=DATA, help="causal | full | window:W | "
                              "documents:L1,... | ... (docs/masks.md).")] = "causal",
    dtype: Annotated[str, _opt("--dtype", panel=DATA, help="bfloat16 | float32 | ...")
                     ] = "bfloat16",
    lengths: Annotated[str | None, _opt("--lengths", panel=DATA, help="A step of many lengths: "
                                        "fixed:N | lognormal:... | file:PATH | text:PATH.")
                       ] = None,
    capacity: Annotated[int | None, _opt("--capacity", panel=DATA, help="With --lengths: tokens "
                                         "a rank holds (default: the longest).")] = None,
    tokens_per_step: Annotated[int | None, _opt("--tokens-per-step", panel=DATA, help="Tokens a "
                                                "step, all ranks (default: a sequence a DP "
                                                "replica).")] = None,
    batches: Annotated[int, _opt("--batches", panel=DATA, help="With --lengths: seeded batches "
                                 "dealt and timed (the mean).")] = 2,
    cluster: Annotated[str, _opt("--cluster", panel=CLUSTER, help="A preset (h100-sxm, h200-sxm, "
                                 "loongtrain-a100, ...) or a YAML file.")] = "local",
    world: Annotated[int, _opt("--world", "-P", panel=CLUSTER, help="Ranks: the SP group, or "
                               "all GPUs (DP x SP) at --scope cluster.")] = 8,
    nodes: Annotated[int | None, _opt("--nodes", panel=CLUSTER, help="Nodes the ranks span "
                                      "(default: world / GPUs a node).")] = None,
    kernel: Annotated[str, _opt("--kernel", panel=CLUSTER, help="flash2 | flash3 | sdpa-flash | "
                                "sdpa-cudnn | sdpa-efficient.")] = "flash2",
    scope: Annotated[str, _opt("--scope", panel=SEARCH, help="attention (default: a layer) | model "
                               "(a step) | cluster (DP x SP).", show_default=False)
                 ] = "attention",
    sp: Annotated[int | None, _opt("--sp", panel=SEARCH, help="Only this SP degree (--scope "
                                   "cluster).")] = None,
    algorithm: Annotated[str | None, _opt("--algorithm", panel=SEARCH, help="Only this "
                                          "algorithm (auto: the best at each group size).")
                         ] = None,
    layout: Annotated[str | None, _opt("--layout", panel=SEARCH, help="Only this layout: "
                                       "contiguous | zigzag | stripe | balanced.")] = None,
    option: Annotated[list[str] | None, _opt("--option", panel=SEARCH, help="Pin an algorithm "
                                             "option, KEY=VALUE (dhp=4, ...); repeatable.",
                                             metavar="K=V")
                      ] = None,
    ep: Annotated[int | None, _opt("--ep", panel=SEARCH, help="Only this expert parallelism "
                                   "(MoE: experts over groups of ep ranks).")] = None,
    routing_skew: Annotated[float, _opt("--routing-skew", panel=SEARCH, help="Busiest EP rank's "
                                        "routed tokens / the mean (default 1).",
                                        show_default=False)] = 1.0,
    states: Annotated[str | None, _opt("--states", panel=SEARCH, help="Only: dp_sp | sp | node "
                                       "| replicated | zero1.")] = None,
    checkpoint: Annotated[str | None, _opt("--checkpoint", panel=SEARCH, help="Only: none | "
                                           "full | sc++ | seq:F | sc++,seq:F | seq-attn:F.")
                          ] = None,
    fused_head: Annotated[bool | None, _opt("--fused-head/--no-fused-head", panel=SEARCH,
                                            help="Only with / without the fused LM head.")
                          ] = None,
    offload: Annotated[str | None, _opt("--offload", panel=SEARCH, help="Only: none, or a comma "
                                        "list of optimizer, params, activations.")] = None,
    tiled: Annotated[bool | None, _opt("--tiled/--no-tiled", panel=SEARCH, help="Only with / "
                                       "without the tiled MLP and loss.")] = None,
    sp_policy: Annotated[str | None, _opt("--sp-policy", panel=SEARCH, help="With --lengths: "
                                          "only static or dynamic SP groups.")] = None,
    packing: Annotated[str | None, _opt("--packing", panel=SEARCH, help="With --lengths: only "
                                        "best-fit or cost-balanced packs.")] = None,
    group_sizes: Annotated[str, _opt("--group-sizes", panel=SEARCH, help="With --lengths: "
                                     "dynamic group sizes, power-of-two (default) | any.",
                                     show_default=False)
                           ] = GROUP_SIZES[0],
    degrees: Annotated[str, _opt("--degrees", panel=SEARCH, help="With --lengths: dynamic "
                                 "group sizes, smallest (default) | cost.", show_default=False)
                     ] = SMALLEST,
    max_seq: Annotated[bool, _opt("--max-seq/--no-max-seq", panel=SEARCH, help="The longest "
                                  "sequence each configuration fits, not --seq-len's.",
                                  show_default=False)] = False,
    top: Annotated[int, _opt("--top", panel=SHOW, help="Rows shown (0: all; the search is then "
                             "exhaustive).")] = 20,
    as_json: Annotated[bool, _opt("--json/--no-json", panel=SHOW, help="Print JSON (every "
                                  "configuration's fields), not a table.", show_default=False)
                       ] = False,
    validate: Annotated[str | None, _opt("--validate", panel=SHOW, help="A finished sweep's id: "
                                         "predicted vs measured per trial.")] = None,
    from_file: Annotated[str | None, _opt("--from", panel=FILE_PANEL, help="The same as FILE.",
                                          metavar="FILE")
                         ] = None,
    save: Annotated[str | None, _opt("--save", panel=FILE_PANEL, help="Write the question "
                                     "(every flag, defaults resolved) to FILE, then answer it.",
                                     metavar="FILE")
                    ] = None,
) -> None:
    """Rank every valid configuration by predicted time or tokens per GPU per second; the
    longest sequence each fits (--max-seq); or --validate a finished sweep. --save FILE keeps the
    question, `seqpar plan FILE` asks it again (docs/planner.md explains every flag and column)."""
    require(not (file and from_file), "from", from_file, f"names the plan file FILE ({file}) "
            "names already: give one")
    require(save is None or Path(save).parent.is_dir(), "save", save, "no such directory")
    q = question(ctx, file or from_file)
    nodes_of = answer(q)
    if save is not None:
        write(save, q, ctx, {"nodes": str(nodes_of)} if nodes_of else {})
        sys.stdout.flush()  # the answer, then the line on stderr
        err_console.print(f"saved the question to {save}: `seqpar plan {save}` asks it again",
                          highlight=False, soft_wrap=True)


def answer(q: Question) -> int | None:
    """Answer the question `q`; the nodes its ranks span where it did not say (None: no plan)."""
    require(q.scope in ("attention", "model", "cluster"), "scope", q.scope,
            "must be attention, model or cluster")
    require(q.top >= 0, "top", q.top, "must be 0 (all) or more")
    c = clusters.load(q.cluster)
    if q.validate is not None:
        from seqpar.cli.plan_validate import validate  # torch, the sweep's specs: only here

        validate(q.validate, c, q.as_json)
        return None
    check_counts(seq_len=q.seq_len, world=q.world, batches=q.batches,
                 **({"nodes": q.nodes} if q.nodes is not None else {}))
    mask = None if q.mask == "causal" else q.mask  # the default: every plan's own causal path
    if q.lengths is None:
        given = next((f"--{k.replace('_', '-')}" for k, v in (
            ("capacity", q.capacity), ("sp_policy", q.sp_policy), ("packing", q.packing),
            ("batches", q.batches != 2), ("group_sizes", q.group_sizes != GROUP_SIZES[0]),
            ("degrees", q.degrees != SMALLEST)) if v), None)
        require(given is None, given or "", True, "needs --lengths (a step of variable-length "
                "sequences)")
    else:
        require(q.scope == "cluster", "scope", q.scope, "--lengths plans a step of the whole "
                "pool: use --scope cluster (--sp D plans one static SP degree)")
        require(not q.max_seq, "max-seq", True, "finds the longest single sequence; with "
                "--lengths, --seq-len is the longest a step holds and --capacity what a rank "
                "holds")
    require(q.algorithm != AUTO or (q.lengths is not None and q.sp_policy != "static"),
            "algorithm", q.algorithm, "chooses an algorithm per group size of the dynamic "
            "policy: needs --lengths (and not --sp-policy static)")
    if mask is not None and q.lengths is None:
        require(not q.max_seq, "mask", mask, "--max-seq plans plain causal attention (a mask "
                "is of one length)")
        masks.parse(mask, q.seq_len)  # a bad mask: one line, before any search
    require(q.ep in (None, 1) or (q.scope != "attention" and q.lengths is None and not q.max_seq),
            "ep", q.ep, "plans a whole step of fixed-length sequences: --scope model or cluster, "
            "without --lengths or --max-seq")
    nodes = q.nodes or max(1, -(-q.world // c.gpus_per_node))
    ranks_per_node_of(q.world, nodes, None)  # nodes divide the world: the one rule
    filters = Filters(sp=q.sp, algorithm=q.algorithm, layout=q.layout, states=q.states,
                      checkpoint=q.checkpoint, fused_head=q.fused_head, tiled=q.tiled,
                      offload=None if q.offload is None else offload_names(q.offload),
                      options=pins.parse(q.option), ep=q.ep)
    check_filters(filters)  # what the runner trains beside a pinned EP
    names = [n for n in algorithms.REGISTRY if q.algorithm is None or n == q.algorithm]
    if q.scope == "cluster":
        worlds = [s for s in range(1, q.world + 1)
                  if q.world % s == 0 and (q.sp is None or s == q.sp)]
        if q.algorithm != AUTO:
            pins.check([n for n in names if n != "local"], [w for w in worlds if w > 1] or worlds,
                       filters.options)
        if q.lengths is not None:
            check_counts(**({"capacity": q.capacity} if q.capacity is not None else {}),
                         **({"tokens_per_step": q.tokens_per_step} if q.tokens_per_step else {}))
            from seqpar.cli.plan_lengths import plan_lengths  # the lengths' rules: only here

            plan_lengths(c, q.model, q.lengths, q.seq_len, q.tokens_per_step, q.capacity,
                         q.world, nodes, kernel=q.kernel, dtype=q.dtype, filters=filters,
                         top=q.top, as_json=q.as_json, mask=mask, sp_policy=q.sp_policy,
                         packing=q.packing, batches=q.batches, group_sizes=q.group_sizes,
                         degrees=q.degrees)
        else:
            _cluster(q, c, nodes, filters, mask)
        return nodes

    names = [n for n in names if (n == "local") == (q.world == 1)]
    pins.check(names, [q.world], filters.options)
    space = pins.space(names, q.world, filters.options)
    layouts = (q.layout,) if q.layout else LAYOUTS
    if q.max_seq:
        found = max_seq(c, q.model, q.world, space, nodes=nodes, scope=q.scope, dtype=q.dtype,
                        filters=filters, layouts=layouts)
        max_seq_table(found, c, q.model, q.world, nodes, q.scope, q.top, q.as_json)
    elif q.scope == "model":
        result = scopes.model_search(c, q.model, q.seq_len, q.world, space, nodes=nodes,
                                        dtype=q.dtype, kernel=q.kernel, filters=filters,
                                        layouts=layouts, mask=mask, every=q.top == 0,
                                        routing_skew=q.routing_skew)
        seen = f", mask {mask}" if mask else ""
        steps_table(result.ranked, f"{q.model} N={q.seq_len:,} P={q.world} on {c.name} ({nodes} "
                    f"node(s)), scope model, kernel {q.kernel}{seen}", c, q.top, q.as_json,
                    {"scope": "model", "model_params": result.model_params,
                     "kernel": q.kernel, "mask": mask or "causal",
                     "world": q.world, "nodes": nodes, "dominated": result.dominated,
                     "too_big": result.too_big}, result)
    else:
        ranked = scopes.rank(c, q.model, q.seq_len, q.world, space, nodes=nodes,
                                scope=q.scope, dtype=q.dtype, kernel=q.kernel, filters=filters,
                                layouts=layouts, mask=mask)
        attention_table(ranked, c, q.model, q.seq_len, q.world, nodes, q.top, q.as_json,
                        q.kernel, mask, scopes.model_params_of(q.model))
    return nodes


def _cluster(q: Question, c, nodes: int, filters: Filters, mask: str | None) -> None:
    """The DP x SP splits of the world, every algorithm and policy at each, ranked by TGS."""
    tokens = q.tokens_per_step
    setup = make_setup(c, q.model, q.seq_len, tokens, q.world, nodes, kernel=q.kernel,
                       dtype=q.dtype, mask=mask, ep=q.ep, routing_skew=q.routing_skew)
    result = search(setup, filters, keep=q.top or None, every=q.top == 0)
    head = {"scope": "cluster", "model": q.model, "model_params": result.model_params,
            "kernel": q.kernel, "kernel_source":
            setup.kernel_source, "world": q.world, "nodes": nodes, "seq_len": q.seq_len,
            "tokens_per_step": tokens, "mask": mask or "causal",
            "splits": [{"dp": d, "sp": s, "micro_batches": m} for d, s, m in result.splits],
            "searched": result.searched, "dominated": result.dominated,
            "too_big": result.too_big, "bounded": result.bounded}
    per_step = f"{tokens:,} tokens a step" if tokens else "one sequence per DP replica a step"
    title = (f"{q.model} N={q.seq_len:,}, {per_step} on {q.world} GPUs ({nodes} node(s)) "
             f"of {c.name}, kernel {q.kernel}" + (f", mask {mask}" if mask else ""))
    steps_table(result.ranked, title, c, q.top, q.as_json, head, result)
    if not q.as_json:
        console.print(f"kernel rates: {setup.kernel_source}", soft_wrap=False, overflow="fold")
        console.print(f"{result.searched} configurations timed over {len(result.splits)} DP x SP "
                      f"split(s); not timed: {result.dominated} dominated attention "
                      f"configurations, {result.too_big} that fit under no policy, "
                      f"{result.bounded} that cannot reach the top {q.top}")
