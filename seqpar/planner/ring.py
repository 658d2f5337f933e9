"""A ring stage's time: every step of every ring at once, without visiting every rank at every step.

A ring of n positions in inner rings of w runs n steps (outer step o, inner step i); at each, every
position computes the block it holds while the next one travels. A step lasts as long as its
slowest rank (on a host, at least all ranks' work over the cores). What a block costs depends only
on how its two sides compare (`RingStage.keys`: by default whether the block that started at src is
before, at or after pos), so a ring has at most a few kinds of block, each costed once, and a step
is known by how many blocks of each kind it holds. For the plain and double ring those counts have
a closed form (`_ordered`); other rings count them over a (steps x positions) array (`_keyed`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from seqpar.planner.net import ByIdentity, Cost, Hops
from seqpar.planner.schedule import RingStage

if TYPE_CHECKING:
    from seqpar.planner.job import Job, Timing


@lru_cache(maxsize=64)
def steps(n: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(outer step, inner step) of each step of a ring of n in inner rings of w, in order."""
    return np.repeat(np.arange(n // w), w), np.tile(np.arange(w), n // w)


@lru_cache(maxsize=8)
def sources(n: int, w: int) -> np.ndarray:
    """(steps x positions): the position whose block each position holds at each step
    (rules.groups.NestedRing.source, for all at once)."""
    outer, (o, i) = n // w, steps(n, w)
    big_i, t = np.divmod(np.arange(n), w)
    return ((big_i[None, :] - o[:, None]) % outer) * w + (t[None, :] - i[:, None]) % w


def _cost(job: Job, st: RingStage, r: int, pos: int, src: int) -> tuple[float, float]:
    return job.ring_work(*st.blocks(r, pos, src), st.heads, st.factor)


def _first_max(cands: list[tuple[float, float]]) -> tuple[float, float]:
    """(seconds, FLOPs) of the first busiest block in rank order (no work: no FLOPs)."""
    worst, flops = 0.0, 0.0
    for t, f in cands:
        if t > worst:
            worst, flops = t, f
    return worst, flops


class _Walk(NamedTuple):
    """A ring of n positions in inner rings of w, step by step, whatever it carries: the first step
    (every position at home), how many positions hold an earlier and a later block (`_ordered`),
    and how many blocks each position sends (`ring_time`'s fixed costs)."""

    outer: int
    first: np.ndarray
    n_earlier: np.ndarray
    n_later: np.ndarray
    blocks_out: np.ndarray


@lru_cache(maxsize=64)
def _walk(n: int, w: int) -> _Walk:
    outer, (o, i) = n // w, steps(n, w)
    first = (o == 0) & (i == 0)
    n_earlier = np.where(first, 0, np.where(o == 0, outer * (w - i), (outer - o) * w))
    n_later = np.where(first, 0, np.where(o == 0, outer * i, o * w))
    blocks_out = ((i < w - 1).astype(int) + ((i == 0) & (o < outer - 1))) if n > 1 else 0 * i
    return _Walk(outer, first, n_earlier, n_later, blocks_out)


def _ordered(job: Job, st: RingStage, rings: int, copies: int,
             total: bool) -> tuple[Any, ...]:
    """(each step's worst seconds, all steps' FLOPs at the stage's factor, each step's seconds of
    all ranks: with `total`, else None) when a block depends only on whether src is before, at
    or after pos. At step (0, 0) every position
    holds its own block; at (0, i > 0) the outer*(w - i) positions with inner index >= i hold an
    earlier block and the rest a later one; at o > 0 the (outer - o)*w positions of inner rings
    >= o an earlier one. Position 0 holds a later block in every step but the first (it comes
    first on a tie)."""
    n = st.size
    own = [_cost(job, st, r, 0, 0) for r in range(rings)]
    if n == 1:
        (t, f), = own
        return np.array([t]), _flops(np.array([f]), st.factor), np.array([t * copies])
    earlier = [_cost(job, st, r, 1, 0) for r in range(rings)]
    later = [_cost(job, st, r, 0, 1) for r in range(rings)]
    walk = _walk(n, st.inner)
    first = walk.first
    mixed = _first_max([x for pair in zip(later, earlier, strict=True) for x in pair])
    at_home = _first_max(own)
    worst = np.where(first, at_home[0], mixed[0])
    flops = _home_and_away(n, st.inner, at_home[1], mixed[1], st.factor)
    if not total:
        return worst, flops, None
    return worst, flops, (walk.n_earlier * sum(t for t, _ in earlier)
                          + walk.n_later * sum(t for t, _ in later)
                          + np.where(first, n * sum(t for t, _ in own), 0.0)) * copies


def _flops(per_step: np.ndarray, factor: float) -> float:
    """All steps' FLOPs at `factor` (forward 1, backward its kernel's)."""
    return float(_sum(per_step * factor))


@lru_cache(maxsize=4096)
def _home_and_away(n: int, w: int, home: float, away: float, factor: float) -> float:
    """`_flops` of a ring whose first step's busiest block costs `home` and every other's `away`
    (memoised: a plan meets the same blocks under many configurations)."""
    return _flops(np.where(_walk(n, w).first, home, away), factor)


def _kinds(st: RingStage, rings: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """Per step and kind of block: how many ranks hold one, and the first of them in ring order
    (`_NONE` where none does); and per kind one (ring, position, source) that meets it. A kind is
    a way the block's keys compare; at most 3^parts of them. Memoised on the stage's keys (a plan
    asks for each layout; a schedule shares one grid's keys between its stages and shapes)."""
    assert st.keys is not None
    return _KINDS.get(st.keys, lambda: _kinds_alike(st, rings), st.size, st.inner, rings)


def _kinds_alike(st: RingStage, rings: int) -> tuple[np.ndarray, np.ndarray,
                                                     list[tuple[int, int, int]]]:
    """`_kinds_of`, shared by the stages whose rings' keys are the same (the configurations of
    one algorithm a plan ranks build them again: wallfacer's sub-rings by placement, say)."""
    here, there = (k[:rings] for k in st.keys)
    key = (st.size, st.inner, *((k.shape, k.dtype.str, k.tobytes()) for k in (here, there)))
    got = _ALIKE.get(key)
    if got is None:
        if len(_ALIKE) >= 256:
            _ALIKE.clear()
        got = _ALIKE[key] = _kinds_of(st, rings)
    return got


def _kinds_of(st: RingStage, rings: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    n, w = st.size, st.inner
    src = sources(n, w)
    here, there = (k[:rings].reshape(rings, n, -1) for k in st.keys)
    parts, steps_n = here.shape[2], len(src)
    k = 3 ** parts
    # (steps, rings, positions): each step's ranks in ring order, each part compared (0 before,
    # 1 at, 2 after) and the parts' comparisons one kind
    kind = np.zeros((steps_n, rings, n), dtype=np.int8 if k <= 127 else np.int64)
    for part in range(parts):
        d = there[:, src, part].transpose(1, 0, 2) - here[None, :, :, part]
        kind += ((d > 0).astype(kind.dtype) - (d < 0) + 1) * 3 ** part
    held = kind.reshape(steps_n, -1)
    counts = np.bincount((held + np.arange(steps_n)[:, None] * k).ravel(),
                         minlength=steps_n * k).reshape(steps_n, k)  # per step, each kind's
    kinds = np.flatnonzero(counts.sum(axis=0))  # the kinds met
    count = np.ascontiguousarray(counts[:, kinds])
    first = np.empty((steps_n, len(kinds)), dtype=np.int64)
    meets = []
    for j, v in enumerate(kinds):
        at = (held == v).argmax(axis=1)
        first[:, j] = np.where(count[:, j] > 0, at, _NONE)
        s_ = int((count[:, j] > 0).argmax())  # the first step that meets it, and its first rank
        r_, p = divmod(int(at[s_]), n)
        meets.append((r_, p, int(src[s_, p])))
    return count, first, meets


_sum = np.add.reduce  # ndarray.sum's own reduction, without its Python wrapper
_KINDS = ByIdentity(64)
_ALIKE: dict[tuple, tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]] = {}
_NONE = np.iinfo(np.int64).max


def _keyed(job: Job, st: RingStage, rings: int, copies: int,
           total: bool) -> tuple[Any, ...]:
    """(each step's worst seconds, all steps' FLOPs at the stage's factor, each step's seconds of
    all ranks: with `total`, else None) from the rings' keys: a block is costed once per way its
    keys compare, whichever ring meets it; a step's busiest rank is the first in ring order to
    hold its dearest kind."""
    count, first, meets = _kinds(st, rings)
    cost = np.array([_cost(job, st, r, pos, src) for r, pos, src in meets])
    t, f = cost[:, 0], cost[:, 1]
    held = np.where(count > 0, t, -np.inf)
    worst = held.max(axis=1)
    dearest = np.where(held == worst[:, None], first, _NONE).argmin(axis=1)
    return (worst, _flops(np.where(worst > 0, f[dearest], 0.0), st.factor),
            (count * t).sum(axis=1) * copies if total else None)


def _each(job: Job, st: RingStage, rings: int, copies: int, total: bool) -> tuple[Any, ...]:
    """(each step's worst seconds, all steps' FLOPs at the stage's factor, each step's seconds of
    all ranks) under any mask: every (position, block) costs its own (what a mask lets a
    position's queries see of a block is its own)."""
    n, src = st.size, sources(st.size, st.inner)
    steps_n = len(src)
    t_all = np.zeros((steps_n, rings * n))
    f_all = np.zeros((steps_n, rings * n))
    for r in range(rings):
        for pos in range(n):
            for g in range(steps_n):
                t_all[g, r * n + pos], f_all[g, r * n + pos] = _cost(job, st, r, pos,
                                                                   int(src[g, pos]))
    busiest = t_all.argmax(axis=1)
    worst = t_all.max(axis=1)
    return (worst, _flops(np.where(worst > 0, f_all[np.arange(steps_n), busiest], 0.0), st.factor),
            t_all.sum(axis=1) * copies)


def _host(job: Job, worst: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Cluster.host_seconds of every step, on a host whose cores the ranks share."""
    c = job.cluster
    return np.array([c.host_seconds(a, b, job.world)
                     for a, b in zip(worst.tolist(), total.tolist(), strict=True)])


class _Carry(NamedTuple):
    """What a ring stage costs beside its blocks' kernels, alike under every layout: each step's
    fixed work, and the transfers (inner hop, outer prefetch, the last gradient's trip home) with
    the stage's cost (its slowest hop's seconds, the busiest rank's bytes by link) and link time."""

    fixed: np.ndarray
    x_in: Cost
    x_out: Cost
    home: Cost
    cost: Cost
    busy: dict[str, float]


def _carry(job: Job, st: RingStage) -> _Carry:
    c, net, n, w = job.cluster, job.net, st.size, st.inner
    walk = _walk(n, w)
    outer = walk.outer
    # what every rank does beside its kernels: the fixed step cost; backward, packing the
    # travelling gradient and adding the one that arrives; on a host transport, sending and
    # receiving this step's messages (K,V or the query block, while one more is to come; the
    # outer prefetch at an inner ring's start; the gradient every step)
    grads = 1 if (st.grad and n > 1) else 0
    fixed = np.array([c.step_us * 1e-6 + c.copy_seconds(2 * grads * st.grad)
                      + c.transport_seconds(2 * (b * st.msg + grads * st.grad), 2 * (b + grads))
                      for b in range(3)])[walk.blocks_out]
    if n == 1:
        return _Carry(fixed, Cost(0.0), Cost(0.0), Cost(0.0), Cost(0.0), {})
    inner_pairs, outer_pairs = _HOPS.get(st.rings, lambda: _hops(st.rings, w), w)

    def both(pairs):  # the block and the gradient behind it: one link, or (emulated) each its own
        if c.shared_links or not st.grad:
            return net.p2p(pairs, st.msg + st.grad)
        a, b = net.p2p(pairs, st.msg), net.p2p(pairs, st.grad)
        return Cost(max(a.seconds, b.seconds), a.intra + b.intra, a.inter + b.inter,
                    max(a.intra_s, b.intra_s), max(a.inter_s, b.inter_s))

    x_in = both(inner_pairs) if w > 1 else Cost(0.0)
    x_out = both(outer_pairs) if outer > 1 else Cost(0.0)
    # the last gradient's trip home is exposed (its host transport cost is the last step's)
    home = net.p2p(outer_pairs if outer > 1 else inner_pairs, st.grad)
    cost = max((x_in, x_out), key=lambda x: x.seconds)
    # bytes by link: the busiest rank's messages, inner and outer hops as the ring makes them
    intra = inter = 0
    for x, count in ((x_in, (w - 1) * outer), (x_out, outer - 1)):
        intra += x.intra * count
        inter += x.inter * count
    last = st.nbytes - intra - inter
    if last > 0:
        if home.inter:
            inter += last
        else:
            intra += last
    busy = {link: x_in.busy(link) * (w - 1) * outer + x_out.busy(link) * (outer - 1)
            + home.busy(link) for link in ("intra", "inter")}
    return _Carry(fixed, x_in, x_out, home, Cost(cost.seconds, intra, inter), busy)


def ring_time(job: Job, st: RingStage, timing: Timing) -> None:
    """Add the ring stage's time, compute, bytes and link time to `timing`. What does not depend
    on the layout (`_carry`) is memoised on the links per rings, inner ring and message sizes: a
    plan times each of its configurations' stages under each layout, and configurations alike
    but for their blocks ring alike."""
    c, n = job.cluster, st.size
    rings = 1 if st.same_blocks else len(st.rings)
    copies = len(st.rings) if st.same_blocks else 1
    # a host whose ranks share its cores: a step lasts at least all ranks' work over the cores
    shared = c.host_seconds(1.0, float("inf"), job.world) != 1.0
    cost = _each if job.any_mask else _ordered if st.keys is None else _keyed
    worst, flops, total = cost(job, st, rings, copies, shared)
    carry = job.net.memo.get(st.rings, lambda: _carry(job, st), st.inner, st.msg, st.grad)
    fixed = carry.fixed
    comp = (_host(job, worst + fixed, total + n * len(st.rings) * fixed) if shared
            else worst + fixed)
    total_compute = float(_sum(comp))
    if n == 1:
        timing.add(st.label, total_compute, total_compute, Cost(0.0), flops)
        return
    per_outer = comp.reshape(-1, st.inner)
    inner_time = _sum(np.maximum(per_outer[:, :-1], carry.x_in.seconds), axis=1) + per_outer[:, -1]
    seconds = (float(_sum(np.maximum(inner_time[:-1], carry.x_out.seconds)) + inner_time[-1])
               + carry.home.seconds)
    timing.add(st.label, seconds, total_compute, carry.cost, flops, carry.busy)


def _hops(rings: list[list[int]], w: int) -> tuple[Hops, Hops]:
    """(senders, receivers) of every ring's inner hop (to the next position of its inner ring)
    and outer hop (to the same position of the next inner ring)."""
    members = _MEMBERS.get(rings, lambda: _members(rings))
    big_i, t = np.divmod(np.arange(members.shape[1]), w)
    outer = members.shape[1] // w
    src = members.ravel()
    return (Hops(src, members[:, big_i * w + (t + 1) % w].ravel()),
            Hops(src, members[:, ((big_i + 1) % outer) * w + t].ravel()))


def _members(rings: list[list[int]]) -> np.ndarray:
    """The rings' ranks as an array (rings x positions), read once a rings object (its inner
    rings' sizes each make their own hops)."""
    if isinstance(rings, list) and rings and isinstance(rings[0], list):  # read flat: faster
        return np.fromiter(chain.from_iterable(rings), dtype=np.int64).reshape(len(rings), -1)
    return np.asarray(rings)


_HOPS = ByIdentity()
_MEMBERS = ByIdentity()
