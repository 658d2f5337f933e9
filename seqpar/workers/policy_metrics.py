"""The numbers of a step of variable-length sequences dealt to groups (an SP policy), computed once
on the driver from the ranks' records and the trial's deals (`workers.metrics` adds them).

Every number is a step's (the average over the replayed batches), beside the trial's own:
`load_imbalance` keeps its meaning (max / mean attention FLOPs over ranks); `busy_imbalance` is
max / mean of the ranks' busy time (their micro-batches' forward and backward, a collective's wait
for a slower peer included); `idle_ms_mean` and `idle_ms_max` the time a rank had no micro-batch
to run before the pool's last one ended (the step's micro-batches' span less the rank's busy time;
the gradient reduction and the optimizer after it are not idle); `seqs_on_group_<d>`
the sequences a step runs on groups of d ranks (the degrees' histogram); `bytes_group_<d>` what the
pool sent in micro-batches on groups of d ranks; `batch_step_ms_min`, `_max` and `batch_spread`
(max / min) the spread of the step time over the batches (the interval and noise verdict are over
whole passes of every batch: they measure the machine, not the data); `deal_gap` and
`deal_imbalance` the deal's own prediction (its makespan over a lower bound; its busy imbalance),
`micro_batches_max` the most micro-batches a rank ran.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from seqpar.case import TrainCase

if TYPE_CHECKING:
    from seqpar.workers.measure.record import RankMeasurement


def values(case: TrainCase, ranks: Sequence[RankMeasurement]) -> dict[str, float]:
    """The policy's numbers of one trial (see the module docstring)."""
    count = len(case.batches)
    details = [m.extra.get("varlen", {}) for m in ranks]
    out: dict[str, float] = {}
    busy = [sum(d.get("busy_ms", [])) / count for d in details]
    if busy and statistics.mean(busy) > 0:
        out["busy_imbalance"] = max(busy) / statistics.mean(busy)
        spans = [d.get("span_ms", [0.0] * count) for d in details]
        last = [max(s[i] for s in spans) for i in range(count)]  # the pool's last micro-batch
        idle = [sum(max(0.0, last[i] - d["busy_ms"][i]) for i in range(count)) / count
                for d in details]
        out["idle_ms_mean"], out["idle_ms_max"] = statistics.mean(idle), max(idle)
    sizes: dict[int, int] = {}
    for b in case.batches:
        for size, n in b.deal.degrees.items():
            sizes[size] = sizes.get(size, 0) + n
    for size, n in sorted(sizes.items()):
        out[f"seqs_on_group_{size}"] = n / count
    sent: dict[str, float] = {}
    for d in details:
        for size, n in d.get("bytes_by_size", {}).items():
            sent[size] = sent.get(size, 0.0) + n / count
    for size in sorted(sent, key=int):
        out[f"bytes_group_{size}"] = sent[size]
    per_batch = [d.get("batch_ms") for d in details if d.get("batch_ms")]
    if per_batch:  # each batch: the slowest rank of each timed pass, then the median over passes
        medians = [statistics.median(max(passes) for passes in zip(*(r[i] for r in per_batch),
                                                                  strict=True))
                   for i in range(count)]
        out["batch_step_ms_min"], out["batch_step_ms_max"] = min(medians), max(medians)
        out["batch_spread"] = max(medians) / min(medians) if min(medians) > 0 else 1.0
    out["deal_gap"] = statistics.mean(b.deal.gap for b in case.batches)
    out["deal_imbalance"] = statistics.mean(b.deal.imbalance for b in case.batches)
    out["micro_batches_max"] = float(max(max(b.deal.counts) for b in case.batches))
    return out
