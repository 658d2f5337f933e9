"""What a rank measures, one module per mode, dispatched by the table `MEASURES`:

    mode         module        what it measures
    fwd, fwd+bwd attention.py  the distributed attention's time, memory and bytes
    accuracy     accuracy.py   the same, plus its errors against the float64 reference
    train        train.py      training steps of the decoder with the attention inside
    (check)      check.py      one exact pass against the reference (`seqpar check`, the tests)

Shared by them: `timing` (the one loop and memory rule, training included), `meters`, `reference`
(the float64 reference and its tolerance) and `record` (a rank's RankMeasurement, built one way,
with the kernel it ran). What the driver computes from the records is `workers.metrics`.

    m = measure(case, rank, group, device, nodes=node_map)   # on every rank of the group
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from seqpar.algorithms.comm import Links
from seqpar.algorithms.mesh import Mesh
from seqpar.case import Case, TrainCase
from seqpar.workers.measure.accuracy import measure_accuracy
from seqpar.workers.measure.attention import measure_attention
from seqpar.workers.measure.record import RankMeasurement
from seqpar.workers.measure.train import measure_training

Measure = Callable[..., RankMeasurement]


# mode -> what a rank runs; each takes (case, rank, group, device, *, nodes, links, mesh)
MEASURES: dict[str, Measure] = {
    "fwd": measure_attention,
    "fwd+bwd": measure_attention,
    "accuracy": measure_accuracy,
    "train": measure_training,
}


def measure(case: Case | TrainCase, rank: int, group: dist.ProcessGroup | None,
            device: torch.device | str = "cpu", *, nodes: Sequence[int] | None = None,
            links: Links | None = None, mesh: Mesh | None = None) -> RankMeasurement:
    """Run the case's mode on this rank (every rank of `group` calls this): the algorithm's mesh is
    built from `group` with the node map `nodes`, unless a prebuilt `mesh` is given; its Comms
    emulate `links` (link class -> LinkModel; None: none)."""
    if mesh is not None and links:
        mesh = mesh.with_links(links)
    return MEASURES[case.mode](case, rank, group, device, nodes=nodes, links=links, mesh=mesh)


def gang_measure(env, case: Case, threads: int | None = None) -> RankMeasurement:
    """`measure` on a LocalGang rank (see platform.localgang), optionally with more threads."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return measure(case, env.rank, env.group(case.world), env.device, mesh=env.mesh)
    finally:
        torch.set_num_threads(before)


__all__ = ["MEASURES", "RankMeasurement", "gang_measure", "measure"]
