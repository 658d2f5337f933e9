"""`seqpar check`: every algorithm in every layout, forward and backward, against the float64
reference on P local ranks (gloo on CPU, NCCL when the machine has P GPUs); `--bench` times them."""

from __future__ import annotations

import secrets
import statistics
import time
from typing import Annotated

import typer

from seqpar.cli.display import console, display_table, err_console
from seqpar.errors import ConfigError, SeqparError, require


def _split(value: str, field: str, allowed: tuple[str, ...]) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    for item in items:
        require(item in allowed, field, item, f"must be one of {', '.join(allowed)}")
    return items


def check(
    world: Annotated[int, typer.Option("--world", "-P", help="Ranks in the group.")] = 4,
    algorithms_: Annotated[str, typer.Option("--algorithms", help="Comma-separated; default all.")] = "",
    layouts_: Annotated[str, typer.Option("--layouts", help="Comma-separated layouts.")] =
        "contiguous,zigzag,stripe",
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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Check every algorithm against the single-process float64 reference (exits 1 on a mismatch)."""
    from seqpar import algorithms
    from seqpar.algorithms.base import DTYPES
    from seqpar.algorithms.layouts import LAYOUTS

    require(world >= 1, "world", world, "must be at least 1")
    require(dtype in DTYPES, "dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    require(device in (None, "cpu", "cuda"), "device", device, "must be 'cpu' or 'cuda'")
    names = _split(algorithms_, "algorithms", tuple(algorithms.REGISTRY)) or list(algorithms.REGISTRY)
    chosen_layouts = _split(layouts_, "layouts", LAYOUTS)
    if bench:
        return run_bench(names, device)
    cases, skipped = plan_cases(names, chosen_layouts, world, seq_len, batch, heads, kv_heads,
                                head_dim, dtype, seed if seed is not None else secrets.randbelow(2**31))
    require(bool(cases), "algorithms", algorithms_ or "all",
            "no case fits these shapes: " + "; ".join(dict.fromkeys(r for _, r in skipped)))
    rows, failed = checked_rows(cases, world, device)
    rows += [[c.algorithm, c.layout, "causal" if c.causal else "full", f"{c.heads}/{c.kv_heads}",
              c.world, "-", "-", "-", "-", f"skipped: {why}"] for c, why in skipped]
    display_table(f"seqpar check: P={world}, N={seq_len}, {dtype}",
                  ["algorithm", "layout", "mask", "H/Hkv", "P", "max rel err", "fwd bytes",
                   "bwd bytes", "ms", "status"], rows, as_json=as_json)
    if failed:
        err_console.print(f"[red]{failed} case(s) failed[/red]")
        raise typer.Exit(1)


# Left at their defaults usp (dhp=1), double_ring (one inner ring of P) and wallfacer (team_size=1)
# are a plain ring; `check` holds each in its first real form the world size allows.
CHECK_FORMS = {
    "usp": lambda p: {"dhp": 2} if p >= 4 and p % 2 == 0 else {},
    "double_ring": lambda p: {"inner_ring": 2} if p >= 4 and p % 2 == 0 else {},
    "wallfacer": lambda p: {"team_size": 2} if p % 4 == 0 else {},
}


def plan_cases(names, layouts, world, seq_len, batch, heads, kv_heads, head_dim, dtype, seed):
    from seqpar.case import Case

    cases, skipped = [], []
    for name in names:
        p = 1 if name == "local" else world
        for layout in layouts:
            for causal in (True, False):
                for hkv in dict.fromkeys((heads, kv_heads)):
                    form = CHECK_FORMS[name](p) if name in CHECK_FORMS else {}
                    case, why = None, ""
                    for options in ([form, {}] if form else [{}]):  # the real form, else defaults
                        case = Case(name, p, layout, causal, batch, seq_len, heads, hkv, head_dim,
                                    dtype, seed, options=tuple(sorted(options.items())))
                        try:
                            case.validate()  # the Case's rules: any length runs
                        except ConfigError as err:
                            why = str(err)
                            continue
                        cases.append(case)
                        break
                    else:
                        skipped.append((case, why))
    return cases, skipped


def checked_rows(cases, world, device):
    """Run every case on a local gang and evaluate it: the table rows and how many failed."""
    from seqpar.platform.localgang import LocalGang
    from seqpar.workers.measure.check import evaluate, run_case

    rows, failed = [], 0
    sizes = {c.world for c in cases}
    err_console.print(f"starting {world} local ranks ...")  # stdout: the table or JSON only
    with LocalGang(world, sizes=sizes, device=device) as gang:
        err_console.print(f"ranks ready on {gang.device}; running {len(cases)} cases")
        for case in cases:
            res = evaluate(case, run_case(gang, case))
            failed += not res.ok
            b = res.bytes_measured
            e = res.bytes_expected
            rows.append([
                case.algorithm + "".join(f" {k}={v}" for k, v in case.options), case.layout,
                "causal" if case.causal else "full",
                f"{case.heads}/{case.kv_heads}", case.world, f"{max(res.errors.values()):.1e}",
                f"{b['forward']}" + (" ✓" if b["forward"] == e["forward"] else f" ≠ {e['forward']}"),
                f"{b['backward']}" + (" ✓" if b["backward"] == e["backward"] else f" ≠ {e['backward']}"),
                f"{1e3 * res.seconds:.1f}", "ok" if res.ok else "FAIL: " + "; ".join(res.failures),
            ])
    return rows, failed


def _median_ms(gang, case, size, threads=None) -> float:
    from seqpar.workers.measure import gang_measure
    from seqpar.workers.measure.check import mesh_key

    results = gang.run(gang_measure, case, threads, size=size, mesh=mesh_key(case))
    return max(statistics.median(r.step_ms) for r in results)


def _best_of(rounds: int, runs: dict[str, tuple]) -> dict[str, float]:
    """Each run's median step, best over `rounds` interleaved rounds: a busy neighbour on this
    machine slows one round, not the comparison."""
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, args in runs.items():
            best[name] = min(best[name], _median_ms(*args))
    return best


def run_bench(names, device, rounds: int = 3) -> None:
    """The foundation benchmark: every algorithm at P=1 against local, and ring at P=2."""
    from seqpar.case import Case
    from seqpar.platform.localgang import LocalGang

    if device == "cuda":
        raise SeqparError("device='cuda': --bench here measures the CPU path; use `seqpar run` "
                          "studies on a GPU cluster")
    start = time.perf_counter()
    with LocalGang(2, sizes=(1,), device="cpu") as gang:
        console.print(f"ranks ready in {time.perf_counter() - start:.1f} s; "
                      f"best of {rounds} interleaved rounds")
        base = dict(layout="zigzag", causal=True, batch=1, heads=8, kv_heads=8, head_dim=64,
                    dtype="float32", warmup=1, iters=5)
        at_one = _best_of(rounds, {name: (gang, Case(name, 1, seq_len=4096, **base), 1)
                                   for name in dict.fromkeys(["local", *names])})
        display_table("each algorithm at P=1 against local (fwd+bwd, causal, H=8, D=64, fp32)",
                      ["algorithm", "P", "N", "step ms", "ratio to local", "target"],
                      [[name, 1, 4096, f"{ms:.1f}", f"{ms / at_one['local']:.3f}", "<= 1.10"]
                       for name, ms in at_one.items()])
        n = 8192
        two = _best_of(rounds, {
            "local, 1 thread": (gang, Case("local", 1, seq_len=n, **base), 1, 1),
            "local, 2 threads": (gang, Case("local", 1, seq_len=n, **base), 1, 2),
            "ring P=2, 1 thread each": (gang, Case("ring", 2, seq_len=n, **base), 2, 1),
        })
        one = two["local, 1 thread"]
        display_table(
            f"ring at P=2 against local (fwd+bwd, causal zigzag, N={n}, H=8, D=64, fp32)",
            ["run", "step ms", "speed-up over local (1 thread)", "parallel efficiency"],
            [[name, f"{ms:.0f}", f"{one / ms:.2f}",
              "-" if name.startswith("local, 1") else
              f"{one / ms / 2:.2f}" + (" (target >= 0.9)" if name.startswith("ring") else "")]
             for name, ms in two.items()])
