"""Any attention mask, as a union of slices (MagiAttention's description, no torch).

A `Slice` (q0, q1, k0, k1, kind) says that queries at positions [q0, q1) see keys at [k0, k1) under
one of four shapes (Lq = q1 - q0, Lk = k1 - k0; a query t sees key k of the rectangle when):

- full: always;
- causal: k <= t + (k1 - q1) — the triangle aligned bottom-right (flash-attn's and MagiAttention's
  causal: on a square slice, k <= t);
- inv_causal: k >= t + (k0 - q0) — aligned top-left;
- bi_causal: both (a band: a sliding window's body).

A `Mask` is a union of slices whose visible pairs do not overlap, over N = `n` tokens: query t sees
key k when some slice says so. Every query row sees a union of at most a few key ranges (one per
slice its row crosses), so the planner counts work and bytes from the slices, the block planner
turns each slice into kernel calls (`blocks.block_tasks`), and the ring schedules carry a block only
to ranks some query of which sees it. A query that sees no key at all gets output 0, log-sum-exp
-inf and gradient 0.

Constructors (`n` the length): `full(n)`, `causal(n)`, `documents(cu, causal=True, window=None)`,
`sliding_window(n, w, causal=True)`, `block_sparse(m_blk, block, causal=False)` (BurstEngine §3.4:
a token of query block i sees key block j where m_blk[i][j]), `dilated(n, block, stride, causal=True)`
(query block i sees key blocks j with (i - j) divisible by stride, j <= i when causal: a block-wise
dilated pattern), `prefix_lm(n, prefix)` (a bidirectional prefix, a causal rest),
`shared_question(question, answers)` (a causal question every answer sees in full, each answer
causal and private), `from_dense(m)` (small N), `from_slices(n, slices)`. The classic ones
(`full`, `causal`, `documents`, `sliding_window`) also carry their `Relation` (one contiguous key
range per query), the planner's and the kernels' fast path. `parse(spec, n)` reads the compact form
of each (see `SPECS`); `from_config({"kind": ..., ...}, n)` the same as a mapping.

Held cheaply: the slices are a tuple (a block-sparse mask keeps one slice per run of visible blocks,
runs of equal block rows merged), the hash is computed once, and every per-row count is numpy.
"""

from seqpar.rules.masks.geometry import (
    DENSE_MAX,
    KINDS,
    Mask,
    Slice,
    check_slices,
    from_slices,
)
from seqpar.rules.masks.kinds import (
    block_sparse,
    causal,
    dilated,
    documents,
    from_dense,
    full,
    prefix_lm,
    random_block_sparse,
    shared_question,
    sliding_window,
)
from seqpar.rules.masks.specs import SPECS, as_spec, default_spec, from_config, parse

__all__ = ["DENSE_MAX", "KINDS", "SPECS", "as_spec", "block_sparse", "causal", "check_slices",
           "default_spec", "dilated", "documents", "from_config", "from_dense", "from_slices", "full",
           "Mask", "parse", "prefix_lm", "random_block_sparse", "shared_question", "Slice",
           "sliding_window"]
