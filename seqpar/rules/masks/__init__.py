"""Any attention mask, as a union of slices (MagiAttention's description, no torch).

A `Slice` (q0, q1, k0, k1, kind) says that queries at positions [q0, q1) see keys at [k0, k1)
under one of four shapes (a query t sees key k of the rectangle when):

- full: always;
- causal: k <= t + (k1 - q1) — the triangle aligned bottom-right (on a square slice, k <= t);
- inv_causal: k >= t + (k0 - q0) — aligned top-left;
- bi_causal: both (a band: a sliding window's body).

A `Mask` is a union of slices whose visible pairs do not overlap, over N = `n` tokens. Every query
row sees at most a few key ranges (one per slice its row crosses), so the planner counts work and
bytes from the slices, the block planner turns each slice into kernel calls (`blocks.block_tasks`)
and the ring schedules carry a block only to ranks some query of which sees it. The classic masks
(`full`, `causal`, `documents`, `sliding_window`) also carry their `Relation`, the fast path.
`parse(spec, n)` reads the compact forms (`SPECS`), `from_config` a mapping. Held cheaply: slices
in a tuple (runs of equal block rows merged), the hash computed once, per-row counts in numpy.
The constructors and compact forms, with examples: docs/masks.md.
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
