"""The comparison's rows as a newcomer reads them: each workload's trials together, its best first and
flagged * (the title and the legend say by which metric, at which workload), and each note under
the table naming its row as the row names itself, also when trials differ only in layout, mask or
SP policy. Synthetic trials: no Ray, no store."""

from __future__ import annotations

import random

from seqpar.platform.tracking import RunRecord
from seqpar.sweeps.report import digest
from seqpar.sweeps.report.table import BEST, table
from seqpar.sweeps.report.view import TrialView

HOST_BUSY = "host busy 71% (other processes' share of the host's CPU time, > 10%, load 1.9)"


def trial(i: int, tps: float, *, algorithm: str = "burst", seq_len: int = 2048,
          layout: str = "contiguous", mask: str | None = None, unstable: bool = False,
          world: int = 2, extra: dict[str, str] | None = None) -> TrialView:
    step = seq_len / tps * 1e3
    tags = {"seqpar.device": "cpu", "seqpar.cpu_count": "2"}
    if unstable:
        tags["seqpar.unstable"] = HOST_BUSY
    params = {"plan.algorithm": algorithm, "plan.world": str(world), "plan.layout": layout,
              "workload.seq_len": str(seq_len), "model.heads": "4", "model.kv_heads": "2",
              "workload.dtype": "float32", **({"workload.mask": mask} if mask else {}),
              **(extra or {})}
    return TrialView.of(RunRecord(f"run{i}", f"trial {i}", "FINISHED", 0, params=params,
                                  metrics={"tokens_per_s": tps, "step_ms": step}, tags=tags))


def _sparse_like(rng: random.Random) -> list[TrialView]:
    """The sparse study's shape: one training configuration under three masks and two layouts,
    every trial unstable (a busy host)."""
    train = {"train.model": "tiny", "train.dp": "1", "train.checkpoint": "sc++"}
    masks = ("causal", "block_sparse:64:0.25:0", "dilated:2")
    return [trial(i, rng.uniform(1e3, 9e3), layout=layout, mask=mask, unstable=True, extra=train)
            for i, (mask, layout) in enumerate((m, lay) for m in masks
                                               for lay in ("contiguous", "balanced"))]


def test_each_note_names_its_row_when_trials_differ_only_in_layout_and_mask(seed):
    runs = _sparse_like(random.Random(seed))
    cmp = table("sweep sparse", runs, "tokens_per_s")
    assert len(cmp.notes) == len(runs) == len(set(cmp.notes))  # one note a row, none alike
    shown = cmp.terse()
    for note, row in zip(cmp.notes, shown.rows, strict=True):
        name = note.split(": ", 1)[0].removeprefix("U ")
        # the note carries every cell that tells this row from the others
        assert name.startswith("burst SP=2 DP=1 ckpt=sc++"), note
        assert f"layout={row[shown.columns.index('layout')]}" in name, (note, row)
        assert f"mask={row[shown.columns.index('mask')]}" in name, (note, row)
    # --where keeps the notes of the rows it keeps, and only those
    kept = digest.where(cmp, ["layout=balanced", "mask=dilated:2"])
    assert len(kept.rows) == 1 and kept.notes == [
        "U burst SP=2 DP=1 ckpt=sc++ layout=balanced mask=dilated:2: host busy 71%"]


def test_a_note_names_the_sp_policy_that_tells_two_rows_apart():
    lengths = {"workload.lengths": "lognormal:1024:1.0", "plan.sp_policy": "dynamic"}
    runs = [trial(0, 5e3, unstable=True, extra=lengths),
            trial(1, 6e3, unstable=True, extra={**lengths, "plan.degrees": "cost"})]
    notes = table("sweep p", runs, "tokens_per_s").notes
    assert [n.split(":")[0] for n in notes] == ["U burst dynamic/cost", "U burst dynamic"]


def test_each_workloads_best_comes_first_flagged_and_explained(seed):
    rng = random.Random(seed)
    runs = [trial(i, rng.uniform(1e3, 9e4), algorithm=a, seq_len=n, world=1 if a == "local" else 2)
            for i, (a, n) in enumerate((a, n) for n in (4096, 2048)
                                       for a in ("local", "ring", "ulysses", "allgather"))]
    rng.shuffle(runs)
    cmp = table("sweep quickstart", runs, "tokens_per_s")
    assert "best by tokens_per_s at each N (higher is better): flagged *, first" in cmp.title
    assert cmp.legend.startswith("flags: * best by tokens_per_s at its N")
    n, tps, flags = (cmp.columns.index(c) for c in ("N", "tok/s", "flags"))
    for length in ("2048", "4096"):
        rows = [r for r in cmp.rows if r[n] == length]
        speeds = [float(r[tps].replace(",", "")) for r in rows]
        assert speeds == sorted(speeds, reverse=True)  # the best first
        assert [r[flags] for r in rows] == [BEST, "", "", ""]  # and only it flagged
    assert [r[n] for r in cmp.rows] == ["2048"] * 4 + ["4096"] * 4  # a workload's rows together
    assert cmp.rows[cmp.best][flags] == BEST
    # by a metric where lower is better, the fastest step first
    by_step = table("sweep quickstart", runs, "step_ms")
    steps = [t.metrics["step_ms"] for t in by_step.trials[:4]]
    assert steps == sorted(steps) and "best by step_ms at each N (lower is better)" in by_step.title


def test_no_star_where_no_trial_has_a_rival():
    cmp = table("sweep one", [trial(0, 1e3)], "tokens_per_s")
    assert cmp.rows[0][cmp.columns.index("flags")] == "" and "flagged" not in cmp.title
    assert cmp.legend == ""


def test_rows_name_the_layers_and_the_ep_that_tell_training_trials_apart(seed):
    """moe-placement's and attention-kinds' rows: trials that differ only in expert parallelism, an
    MLA ring's pass or a hybrid's LASP each read as their own row."""
    rng = random.Random(seed)
    train = {"train.model": "tiny-qwen3-moe", "train.dp": "2", "train.checkpoint": "none"}
    runs = [trial(i, rng.uniform(1e3, 9e3), algorithm="ring", world=4,
                  extra={**train, **extra}) for i, extra in enumerate((
                      {}, {"plan.ep": "1"}, {"plan.ep": "2"}, {"plan.ep": "4"},
                      {"train.mla_pass": "latent"}, {"train.linear_sp": "lasp2"}))]
    names = [r.training.label(4) for r in runs]
    assert names[0] == names[1] == "SP=2 DP=2 ckpt=none"  # ep 1 as before
    assert names[2:4] == ["SP=2 DP=2 EP=2 ckpt=none", "SP=2 DP=2 EP=4 ckpt=none"]
    assert names[4].endswith(" mla_pass=latent") and names[5].endswith(" lasp2")
