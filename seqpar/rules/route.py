"""Transfer skipping on a ring schedule: which messages travel when some blocks are seen by no query
of the ranks they would visit (by default whenever the call is not plain full or causal attention:
documents, a window, any other mask, `Options.skips`; the option `skip_transfers` forces it).

The schedule is `ring.travel`'s: a ring of `size` positions split into inner rings of `inner`
(`groups.DoubleRing`; inner = size is the plain ring). Global step g = o * inner + s is inner step s
of outer step o; the block that started at position src = (a, c) is then held at position
(a + o, c + s). Backward, each block's gradient accumulator follows it home.

`need[pos][src]`: whether the queries at `pos` see any key of the block that started at `src`. It
comes from the global relation, which every rank knows, so every rank computes the same route and a
sender and its receiver always agree on each message. Per block:

- an inner hop at (o, s) travels iff the block is needed later in the same inner ring;
- the prefetch at outer step o travels iff the block is needed at a later outer step;
- the gradient goes from each needed holder straight to the next one and from the last one home
  (one hop); a block needed only at home sends none.

A position that no longer needs a block only relays it when a later one does; with `need=None` the
route is the unskipped schedule message for message. Messages of one step are posted in the same
step on both ends, so no step waits on a later one. Only rings skip; collectives move every shard.
Worked examples: docs/algorithms.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

HOME = -1  # "consumed at" of a gradient that arrives home after the last step
Need = tuple[tuple[bool, ...], ...]


def block_at(size: int, inner: int, src: int, step: int) -> int:
    """The position that holds the block that started at `src` at global step `step`."""
    o, s = divmod(step, inner)
    a, c = divmod(src, inner)
    return ((a + o) % (size // inner)) * inner + (c + s) % inner


@dataclass(frozen=True)
class Journey:
    """One block's route: the steps its holder needs it, and what that implies."""

    size: int
    inner: int
    src: int
    needed: tuple[int, ...]

    @property
    def outer(self) -> int:
        return self.size // self.inner

    def _last_in(self, o: int) -> int:
        """Last needed inner step of outer step o (-1: none)."""
        return max((g % self.inner for g in self.needed if g // self.inner == o), default=-1)

    @property
    def last_outer(self) -> int:
        return max((g // self.inner for g in self.needed), default=-1)

    def hop(self, step: int) -> bool:
        """Whether the block moves on along the inner ring after `step`."""
        o, s = divmod(step, self.inner)
        return s < self.inner - 1 and s < self._last_in(o)

    def fetch(self, o: int) -> bool:
        """Whether the block is prefetched to the next inner ring at the start of outer step o."""
        return o < self.outer - 1 and o < self.last_outer

    def held(self, step: int) -> bool:
        o, s = divmod(step, self.inner)
        if s == 0:
            return o == 0 or o <= self.last_outer
        return s <= self._last_in(o)

    def grads(self) -> list[tuple[int, int, int, bool]]:
        """The gradient's messages: (step sent, to position, consumed at step or HOME, via the
        inner ring). The last needed holder sends home, unless it is home (step 0)."""
        out = []
        for i, g in enumerate(self.needed):
            if i + 1 < len(self.needed):
                nxt = self.needed[i + 1]
                inner = nxt == g + 1 and g % self.inner < self.inner - 1
                out.append((g, block_at(self.size, self.inner, self.src, nxt), nxt, inner))
            elif g > 0:
                out.append((g, self.src, HOME, False))
        return out


@dataclass(frozen=True)
class Plan:
    """What position `pos` does at every step (see the module docstring). Per step g: `held` (it
    holds a block), `needed` (its queries see that block), `hop_send` / `hop_recv` (the inner hop
    after g), `grad_to` (where the gradient computed at g goes: (position, via inner ring) or None),
    `grad_from` (gradients to receive after g: (position, consumed at, via inner ring)); per outer
    step `fetch_send` / `fetch_recv`; `steps`: how many steps to run (the same on every position);
    `home`: 'kept' (its own block's gradient never leaves), 'arrives' or 'none' (no one needs it)."""

    size: int
    inner: int
    pos: int
    steps: int
    held: tuple[bool, ...]
    needed: tuple[bool, ...]
    hop_send: tuple[bool, ...]
    hop_recv: tuple[bool, ...]
    fetch_send: tuple[bool, ...]
    fetch_recv: tuple[bool, ...]
    grad_to: tuple[tuple[int, bool] | None, ...]
    grad_from: tuple[tuple[tuple[int, int, bool], ...], ...]
    home: str

    @property
    def kv_messages(self) -> int:
        """Block messages this position sends (inner hops and prefetches)."""
        return sum(self.hop_send) + sum(self.fetch_send)

    @property
    def grad_messages(self) -> int:
        return sum(t is not None for t in self.grad_to)

    @property
    def full_kv_messages(self) -> int:
        """Block messages of the unskipped schedule: size - 1."""
        return self.size - 1 if self.size > 1 else 0

    @property
    def full_grad_messages(self) -> int:
        """Gradient messages of the unskipped schedule: size."""
        return self.size if self.size > 1 else 0


def journeys(size: int, inner: int, need: Need | None) -> list[Journey]:
    out = []
    for src in range(size):
        needed = tuple(g for g in range(size)
                       if need is None or need[block_at(size, inner, src, g)][src])
        out.append(Journey(size, inner, src, needed))
    return out


@lru_cache(maxsize=1024)
def plan(size: int, inner: int, pos: int, need: Need | None = None) -> Plan:
    """The plan of position `pos` on a ring of `size` with inner rings of `inner` (need=None: the
    unskipped schedule)."""
    outer = size // inner
    js = journeys(size, inner, need)
    if size == 1:
        return Plan(1, 1, 0, 1, (True,), (bool(js[0].needed),), (False,), (False,), (False,),
                    (False,), (None,), ((),), "kept" if js[0].needed else "none")
    last = max((j.needed[-1] for j in js if j.needed), default=0)

    def source(g: int) -> int:
        o, s = divmod(g, inner)
        i, t = divmod(pos, inner)
        return ((i - o) % outer) * inner + (t - s) % inner

    held, needed, hop_send, hop_recv = [], [], [], []
    grad_to: list[tuple[int, bool] | None] = []
    for g in range(size):
        j = js[source(g)]
        held.append(j.held(g))
        needed.append(g in j.needed)
        hop_send.append(j.hop(g))
        hop_recv.append(g % inner < inner - 1 and js[source(g + 1)].hop(g))
        grad_to.append(None)
    grad_from: list[list[tuple[int, int, bool]]] = [[] for _ in range(size)]
    for j in js:
        for g, to, at, via_inner in j.grads():
            frm = block_at(size, inner, j.src, g)
            if frm == pos:
                grad_to[g] = (to, via_inner)
            if to == pos:
                grad_from[g].append((frm, at, via_inner))
    fetch_send = tuple(js[source(o * inner)].fetch(o) for o in range(outer))
    fetch_recv = tuple(o < outer - 1 and js[source((o + 1) * inner)].fetch(o)
                       for o in range(outer))
    mine = js[pos]
    home = "none" if not mine.needed else ("kept" if mine.needed == (0,) else "arrives")
    return Plan(size, inner, pos, last + 1, tuple(held), tuple(needed), tuple(hop_send),
                tuple(hop_recv), fetch_send, fetch_recv, tuple(grad_to),
                tuple(tuple(f) for f in grad_from), home)


def transpose(need: Need) -> Need:
    """need[pos][src] of queries travelling instead of keys: the keys at pos, the queries of src."""
    return tuple(tuple(need[src][pos] for src in range(len(need))) for pos in range(len(need)))
