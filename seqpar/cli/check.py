"""`seqpar check`: every algorithm in every layout, forward and backward, against the float64
reference on P local ranks (gloo on CPU, NCCL when the machine has P GPUs); `--bench` times them.
The command parses, calls `seqpar.workers.checking` (the gang work) and prints."""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Annotated

import typer

from seqpar.cli.display import console, display_table, err_console
from seqpar.errors import require
from seqpar.rules import masks

if TYPE_CHECKING:
    from seqpar.workers.checking import Bench
    from seqpar.workers.measure.check import CheckResult


def _split(value: str, field: str, allowed: tuple[str, ...]) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    for item in items:
        require(item in allowed, field, item, f"must be one of {', '.join(allowed)}")
    return items


def check(
    world: Annotated[int, typer.Option("--world", "-P", help="Ranks in the group.")] = 4,
    algorithms_: Annotated[str, typer.Option("--algorithms", help="Comma-separated; default all.")] = "",
    layouts_: Annotated[str, typer.Option("--layouts", help="Comma-separated layouts.")] =
        "contiguous,zigzag,stripe,balanced",
    mask: Annotated[str, typer.Option("--mask", help="Comma-separated masks instead of causal "
                                      "and full: a kind (window, documents, block_sparse, "
                                      "dilated, prefix_lm, shared_question: sizes from "
                                      "--seq-len) or a compact form (window:8, "
                                      "block_sparse:16:0.3).")] = "",
    seq_len: Annotated[int, typer.Option(help="Tokens in the whole sequence.")] = 64,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 2,
    heads: Annotated[int, typer.Option(help="Query heads.")] = 8,
    kv_heads: Annotated[int, typer.Option(help="K/V heads for the GQA rows (MHA rows use heads).")] = 2,
    head_dim: Annotated[int, typer.Option(help="Head dimension.")] = 16,
    dtype: Annotated[str, typer.Option(help="float64 | float32 | bfloat16.")] = "float64",
    device: Annotated[str | None, typer.Option(help="cpu | cuda; default: cuda when there are "
                                                    "enough GPUs.")] = None,
    seed: Annotated[int | None, typer.Option(help="Input seed; default: fresh.")] = None,
    bench: Annotated[bool, typer.Option("--bench", help="Time the algorithms instead.")] = False,
    lengths: Annotated[str | None, typer.Option(
        "--lengths", help="A training step of sequences of these lengths (fixed:N, "
        "lognormal:mean=M,sigma=S,min=A,max=B, file:PATH, text:PATH) instead of one attention "
        "call: the tiny decoder under the static and the dynamic SP policy, every algorithm, "
        "against the one-process model (docs/lengths.md). --seq-len caps a sequence; --world, "
        "--algorithms, --layouts (in turn), --heads, --kv-heads, --head-dim, --device and --seed "
        "apply; float64 always.")] = None,
    capacity: Annotated[int | None, typer.Option(
        "--capacity", help="With --lengths: tokens a rank holds in a micro-batch (default: the "
        "longest sequence over the ranks, so the lengths need more than one group size).")
    ] = None,
    tokens_per_step: Annotated[int | None, typer.Option(
        "--tokens-per-step", help="With --lengths: a step's tokens (default 4 x the pool's "
        "capacity).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="A model to check instead of the attention alone: a config.json, a YAML "
        "of ModelConfig's fields or a preset name, shrunk to its family's tiny model (every field "
        "that changes a layer kept; docs/models.md), trained by every algorithm in every layout "
        "(a fixed-length step, and steps of lengths under the static and the dynamic policy) "
        "against the one-process model in float64. --world, --algorithms, --layouts, --device and "
        "--seed apply.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Check every algorithm against the single-process float64 reference (exits 1 on a mismatch)."""
    from seqpar import algorithms  # torch: not for --help
    from seqpar.workers import checking

    DTYPES, LAYOUTS = algorithms.base.DTYPES, algorithms.layouts.LAYOUTS
    require(world >= 1, "world", world, "must be at least 1")
    require(dtype in DTYPES, "dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    require(device in (None, "cpu", "cuda"), "device", device, "must be 'cpu' or 'cuda'")
    names = _split(algorithms_, "algorithms", tuple(algorithms.REGISTRY)) or list(algorithms.REGISTRY)
    chosen_layouts = _split(layouts_, "layouts", LAYOUTS)
    if bench:
        _print_bench(checking.bench(names, device, say=console.print))
        return
    if model is not None:
        from seqpar.cli import check_model  # torch: not for --help

        results, skipped = check_model.check_model(model, names, chosen_layouts, world, device,
                                                   seed, as_json)
        _count(results, skipped, "case", as_json, check_model.HOW)
        return
    if lengths is not None:
        _check_lengths(checking, names, world, lengths, capacity, tokens_per_step, seq_len, heads,
                       kv_heads, head_dim, chosen_layouts, device, seed, as_json)
        return
    chosen_masks = [masks.default_spec(m.strip(), seq_len) for m in mask.split(";" if "/" in mask
                                                                                    else ",")
                     if m.strip()]
    for spec in chosen_masks:
        masks.parse(spec, seq_len)  # a bad mask: one line, before any rank starts
    cases, skipped = checking.plan_cases(
        names, chosen_layouts, world, seq_len, batch, heads, kv_heads, head_dim, dtype,
        seed if seed is not None else secrets.randbelow(2**31), chosen_masks)
    require(bool(cases), "algorithms", algorithms_ or "all",
            "no case fits these shapes: " + "; ".join(dict.fromkeys(r for _, r in skipped)))
    results = checking.check_cases(cases, world, device, say=err_console.print)
    rows = [_row(res) for res in results]
    rows += [[c.algorithm, c.layout, _mask(c), f"{c.heads}/{c.kv_heads}",
              c.world, "-", "-", "-", "-", f"skipped: {why}"] for c, why in skipped]
    display_table(f"seqpar check: P={world}, N={seq_len}, {dtype}",
                  ["algorithm", "layout", "mask", "H/Hkv", "P", "max rel err", "fwd bytes",
                   "bwd bytes", "ms", "status"], rows, as_json=as_json)
    _count(results, len(skipped), "case", as_json,
           "output and gradients against float64 attention, bytes against the analytic count; "
           "ms: one forward and backward after an untimed warm-up; --bench times them")


def _count(results: list, skipped: int, what: str, as_json: bool, how: str) -> None:
    """The closing line, '128 of 128 cases exact (...)', on stderr under --json; exit 1 on any
    failure."""
    failed = sum(not r.ok for r in results)
    line = (f"{len(results) - failed} of {len(results)} {what}s exact"
            + (f", {skipped} skipped (no form fits: the rows say why)" if skipped else "")
            + (f"; {failed} {what}(s) failed" if failed else "") + f" ({how})")
    (err_console if as_json else console).print(
        f"[red]{line}[/red]" if failed else line, highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


def _check_lengths(checking, names: list[str], world: int, lengths: str, capacity: int | None,
                   tokens: int | None, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                   layouts: list[str], device: str | None, seed: int | None,
                   as_json: bool) -> None:
    """`check --lengths`: every algorithm's step under each SP policy against one process."""
    from seqpar.experiments import steps  # torch: not for --help

    require(capacity is None or capacity > 0, "capacity", capacity, "must be a positive number "
            "of tokens a rank")
    require(tokens is None or tokens > 0, "tokens-per-step", tokens, "must be positive")
    cases, skipped = steps.check_cases(
        names, world, lengths, capacity=capacity, tokens=tokens, longest=seq_len, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, layouts=layouts,
        seed=seed if seed is not None else secrets.randbelow(2**31),
        forms=checking.CHECK_FORMS)
    require(bool(cases), "algorithms", ",".join(names),
            "no step fits these shapes: " + "; ".join(dict.fromkeys(r for _, r in skipped)))
    cases += _dist_opt(cases)
    results = checking.check_steps(cases, world, device, say=err_console.print)
    first = cases[0]
    rows = [[r.case.algorithm + "".join(f" {k}={v}" for k, v in r.case.options)
             + "".join(f" {d}:{n}" for d, n, _ in r.case.algorithms_by_size),
             r.case.sp_policy + (" cost" if r.case.degrees == "cost" else ""), r.case.states,
             r.case.layout,
             f"{r.case.config().heads}/{r.case.config().kv_heads}",
             " ".join(f"{d}:{n}" for d, n in r.degrees.items()),
             "/".join(str(c) for c in r.counts), f"{r.loss_error:.1e}", f"{r.grad_error:.1e}",
             "ok" if r.ok else "FAIL: " + "; ".join(r.failures)] for r in results]
    rows += [[label.split()[0], label.split()[1], "-", "-", label.split()[2][2:], "-", "-", "-",
              "-", f"skipped: {why}"] for label, why in skipped]
    display_table(f"seqpar check --lengths {lengths}: P={world}, capacity {first.capacity} a rank, "
                  f"{first.tokens_per_step} tokens a step, float64",
                  ["algorithm", "policy", "states", "layout", "H/Hkv", "sequences by group size",
                   "micro-batches a rank", "loss err", "max rel grad err", "status"],
                  rows, as_json=as_json)
    _count(results, len(skipped), "step", as_json,
           "each rank's loss and gradients against the one-process model")


def _dist_opt(cases: list) -> list:
    """Each algorithm's last dynamic step (its GQA one where there is one) again under
    states: dist-opt (sharded over the pool, unequal micro-batch counts)."""
    last = {c.algorithm: c for c in cases if c.sp_policy == "dynamic" and c.world > 1
            and c.degrees == "smallest"}
    return [dataclasses.replace(c, states="dist-opt") for c in last.values()]


def _mask(case) -> str:
    return case.mask[:28] if case.mask else "causal" if case.causal else "full"


def _row(res: CheckResult) -> list:
    case, b, e = res.case, res.bytes_measured, res.bytes_expected
    return [case.algorithm + "".join(f" {k}={v}" for k, v in case.options), case.layout,
            _mask(case), f"{case.heads}/{case.kv_heads}", case.world,
            f"{max(res.errors.values()):.1e}",
            f"{b['forward']}" + (" ✓" if b["forward"] == e["forward"] else f" ≠ {e['forward']}"),
            f"{b['backward']}" + (" ✓" if b["backward"] == e["backward"] else f" ≠ {e['backward']}"),
            f"{1e3 * res.seconds:.1f}", "ok" if res.ok else "FAIL: " + "; ".join(res.failures)]


def _print_bench(b: Bench) -> None:
    local = b.at_one["local"]
    display_table(f"each algorithm at P=1 against local (fwd+bwd, causal, H=8, D=64, fp32, best of "
                  f"{b.rounds})", ["algorithm", "P", "N", "step ms", "ratio to local", "target"],
                  [[name, 1, b.one_n, f"{ms:.1f}", f"{ms / local:.3f}", "<= 1.10"]
                   for name, ms in b.at_one.items()])
    one = b.at_two["local, 1 thread"]
    display_table(
        f"ring at P=2 against local (fwd+bwd, causal zigzag, N={b.two_n}, H=8, D=64, fp32)",
        ["run", "step ms", "speed-up over local (1 thread)", "parallel efficiency"],
        [[name, f"{ms:.0f}", f"{one / ms:.2f}",
          "-" if name.startswith("local, 1") else
          f"{one / ms / 2:.2f}" + (" (target >= 0.9)" if name.startswith("ring") else "")]
         for name, ms in b.at_two.items()])
