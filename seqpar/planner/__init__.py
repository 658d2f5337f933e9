"""The performance model: time, traffic and memory of a configuration on a cluster we may not have.

    from seqpar import planner
    p = planner.predict(clusters.load("loongtrain-a100"), "usp", shape, world=64, nodes=8,
                     options={"dhp": 8, "placement": "context-first"}, layout="zigzag")
    p.attention_ms, p.bytes_inter, p.peak_mem_bytes, p.bottleneck

One place per concern: `schedule` (each algorithm's stages, bytes from the algorithm's own analytic
functions), `net` (links, NICs, contention), `kernel` (attention kernel time by block, from the
layout's blocks), `rates` (the kernel that will run and GEMMs, from documented microbenchmarks),
`predict` (overlap structure), `memory` (per rank), `policy` (a training policy's fields), `step`
(a whole training step of DP x SP ranks), `host` (issuing it), `trial` (a trial's own step),
`search` (--scope model | cluster: splits, algorithms,
policies, ranked by TGS), `plan` (--scope attention, --validate), `maxseq` (--max-seq).
"""

from __future__ import annotations

from seqpar.planner.api import Prediction, predict, predict_spec
from seqpar.planner.trial import predict_trial

__all__ = ["Prediction", "predict", "predict_spec", "predict_trial"]
