"""What `seqpar check` runs on a local gang (no Ray): every algorithm in every layout against the
float64 reference (`check_cases`), and the foundation benchmark (`bench`: every algorithm at P = 1
against `local`, ring at P = 2). The command parses, calls these and prints.

    cases, skipped = plan_cases(names, layouts, world, seq_len, batch, heads, kv_heads, head_dim,
                                dtype, seed)
    results = check_cases(cases, world, device, say=print)    # CheckResult per case
    timings = bench(names, say=print)                         # Bench: median step ms per run
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seqpar.case import Case, TrainCase
from seqpar.errors import ConfigError, SeqparError
from seqpar.platform import localgang
from seqpar.workers import step_check
from seqpar.workers.measure import check as checker
from seqpar.workers.measure import check_model, gang_measure
from seqpar.workers.step_check import check_steps  # noqa: F401  (check --lengths)

Say = Callable[[str], None]  # where progress goes (the CLI: stderr, so stdout is the table)

# Left at their defaults usp (dhp=1), double_ring (one inner ring of P) and wallfacer (team_size=1)
# are a plain ring; `check` holds each in its first real form the world size allows.
CHECK_FORMS: dict[str, Callable[[int], dict[str, object]]] = {
    "usp": lambda p: {"dhp": 2} if p >= 4 and p % 2 == 0 else {},
    "double_ring": lambda p: {"inner_ring": 2} if p >= 4 and p % 2 == 0 else {},
    "wallfacer": lambda p: {"team_size": 2} if p % 4 == 0 else {},
}
BENCH_ROUNDS = 3
BENCH_SHAPE = dict(layout="zigzag", causal=True, batch=1, heads=8, kv_heads=8, head_dim=64,
                   dtype="float32", warmup=1, iters=5)
BENCH_ONE_N, BENCH_TWO_N = 4096, 8192


def plan_cases(names: Sequence[str], layouts: Sequence[str], world: int, seq_len: int, batch: int,
               heads: int, kv_heads: int, head_dim: int, dtype: str, seed: int,
               masks: Sequence[str] = ()) -> tuple[list[Case], list[tuple[Case, str]]]:
    """Every algorithm x layout x {causal, full} (or x each of `masks`, compact forms) x {MHA,
    GQA} case (local on one rank), in its real form where the world allows (else its defaults);
    the ones no form fits, with the reason."""
    cases, skipped = [], []
    relations = [(True, m) for m in masks] or [(True, ""), (False, "")]
    for name in names:
        p = 1 if name == "local" else world
        for layout in layouts:
            for causal, mask in relations:
                for hkv in dict.fromkeys((heads, kv_heads)):
                    form = CHECK_FORMS[name](p) if name in CHECK_FORMS else {}
                    case, why = None, ""
                    for options in ([form, {}] if form else [{}]):  # the real form, else defaults
                        case = Case(name, p, layout, causal, batch, seq_len, heads, hkv, head_dim,
                                    dtype, seed, options=tuple(sorted(options.items())),
                                    mask=mask)
                        try:
                            case.validate()  # the Case's rules: any length runs
                        except ConfigError as err:
                            why = str(err)
                            continue
                        cases.append(case)
                        break
                    else:
                        assert case is not None
                        skipped.append((case, why))
    return cases, skipped


def check_cases(cases: Sequence[Case], world: int, device: str | None,
                say: Say = lambda line: None) -> list[checker.CheckResult]:
    """Every case on a local gang of `world` ranks, held against the float64 reference. Its
    `seconds` are one call's, after an untimed call of the same algorithm on the same mesh: the
    first call pays the groups' and kernels' set-up (seconds, not milliseconds), which no case's
    time should carry."""
    say(f"starting {world} local ranks ...")
    with localgang.LocalGang(world, sizes={c.world for c in cases}, device=device) as gang:
        say(f"ranks ready on {gang.device}; running {len(cases)} cases")
        warm: set[tuple] = set()
        results = []
        for case in cases:
            if (key := (case.algorithm, case.options, checker.mesh_key(case))) not in warm:
                checker.run_case(gang, case)  # the warm-up, untimed
                warm.add(key)
            results.append(checker.evaluate(case, checker.run_case(gang, case)))
        return results


def check_models(fixed: Sequence[check_model.ModelCase], steps: Sequence[TrainCase], world: int,
                 device: str | None, say: Say = lambda line: None) -> list[check_model.ModelCheck]:
    """`check --model`: the model's fixed-length cases (a gang call for each algorithm's) and its
    steps of lengths (TrainCases) on a local gang of `world` ranks, against the one-process model."""
    say(f"starting {world} local ranks ...")
    with localgang.LocalGang(world, sizes={c.world for c in fixed}, device=device) as gang:
        say(f"ranks ready on {gang.device}; running {len(fixed)} cases and {len(steps)} steps")
        by_mesh: dict[tuple, list[check_model.ModelCase]] = {}
        for case in fixed:
            by_mesh.setdefault((case.mesh_key(), case.world), []).append(case)
        out = [got for cases in by_mesh.values() for got in check_model.run_cases(gang, cases)]
        return out + [check_model.evaluate_step(c, gang.run(check_model.rank_step, c),
                                                step_check.reference(c)) for c in steps]


def median_ms(gang: localgang.LocalGang, case: Case, size: int, threads: int | None = None
              ) -> float:
    """The case's median step (ms) on the gang's first `size` ranks: the slowest rank's."""
    results = gang.run(gang_measure, case, threads, size=size, mesh=checker.mesh_key(case))
    return max(statistics.median(r.step_ms) for r in results)


def _best_of(rounds: int, runs: dict[str, tuple]) -> dict[str, float]:
    """Each run's median step, best over `rounds` interleaved rounds: a busy neighbour on this
    machine slows one round, not the comparison."""
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, args in runs.items():
            best[name] = min(best[name], median_ms(*args))
    return best


@dataclass(frozen=True)
class Bench:
    """The foundation benchmark's medians (ms): each algorithm at P = 1, and ring at P = 2 beside
    `local` on one and on two threads."""

    at_one: dict[str, float]
    at_two: dict[str, float]
    rounds: int
    one_n: int = BENCH_ONE_N  # the sequence at P = 1
    two_n: int = BENCH_TWO_N  # the sequence at P = 2


def bench(names: Sequence[str], device: str | None = None, rounds: int = BENCH_ROUNDS,
          say: Say = lambda line: None) -> Bench:
    """Every algorithm at P = 1 against local (N = 4096), and ring at P = 2 against local on one
    thread (N = 8192): fwd+bwd, causal zigzag, H = 8, D = 64, fp32, best of interleaved rounds."""
    if device == "cuda":
        raise SeqparError("device='cuda': --bench here measures the CPU path; use `seqpar run` "
                          "studies on a GPU cluster")
    start = time.perf_counter()
    with localgang.LocalGang(2, sizes=(1,), device="cpu") as gang:
        say(f"ranks ready in {time.perf_counter() - start:.1f} s; best of {rounds} interleaved "
            "rounds")
        at_one = _best_of(rounds, {
            name: (gang, Case(name, 1, seq_len=BENCH_ONE_N, **BENCH_SHAPE), 1)
            for name in dict.fromkeys(["local", *names])})
        local = Case("local", 1, seq_len=BENCH_TWO_N, **BENCH_SHAPE)
        at_two = _best_of(rounds, {
            "local, 1 thread": (gang, local, 1, 1),
            "local, 2 threads": (gang, local, 1, 2),
            "ring P=2, 1 thread each": (gang, Case("ring", 2, seq_len=BENCH_TWO_N, **BENCH_SHAPE),
                                        2, 1),
        })
    return Bench(at_one, at_two, rounds)
