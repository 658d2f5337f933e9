"""`ring`, its rules: (P-1) K,V messages forward; backward K,V again and P dK,dV messages, net of
the messages a route skips (`rules.route`)."""

from __future__ import annotations

from seqpar.rules import route
from seqpar.rules.algorithms.base import Geometry, Rules, latent_message
from seqpar.rules.options import Options
from seqpar.rules.shape import AttnShape


def ring_bytes(kv_bytes: int, world: int, grad_bytes: int | None = None) -> dict[str, int]:
    """Bytes one rank sends in a ring of `world` whose K,V message is kv_bytes and whose dK,dV
    message is grad_bytes (default kv_bytes)."""
    if world == 1:
        return {"forward": 0, "backward": 0}
    grad_bytes = kv_bytes if grad_bytes is None else grad_bytes
    return {"forward": (world - 1) * kv_bytes,
            "backward": (world - 1) * kv_bytes + world * grad_bytes}


def skipped_ring_bytes(kv_bytes: int, grad_bytes: int, plan: route.Plan) -> dict[str, int]:
    """Bytes of `ring_bytes` that a position does not send on its route (`plan`): its skipped
    K,V messages (forward, and again backward) and skipped gradient messages."""
    kv = (plan.full_kv_messages - plan.kv_messages) * kv_bytes
    return {"forward": kv,
            "backward": kv + (plan.full_grad_messages - plan.grad_messages) * grad_bytes}


class RingRules(Rules):
    name = "ring"
    summary = "K,V shards travel a ring; online-softmax merge; overlapped p2p"
    latent_pass = True

    @classmethod
    def latent_bytes(cls, shape, world, options, rank, width, geometry=None):
        """The ring's messages with MLA's latent in place of K,V (and its gradient in place of
        dK,dV)."""
        opts = cls.parse(options)
        kv, grad = latent_message(shape, world, width), latent_message(shape, world, width, opts)
        sent = ring_bytes(kv, world, grad)
        if geometry is None or world == 1 or not opts.skips(geometry.relation):
            return sent
        plan = route.plan(world, cls.ring_inner(world, opts), rank, geometry.need(world))
        skipped = skipped_ring_bytes(kv, grad, plan)
        return {p: sent[p] - skipped[p] for p in sent}

    @classmethod
    def expected_bytes(cls, shape: AttnShape, world: int, options: Options) -> dict[str, int]:
        kv = shape.kv_heads * shape.kv_unit(world)
        grad = shape.kv_heads * shape.kv_grad_unit(world, options)
        return ring_bytes(kv, world, grad)

    @classmethod
    def ring_inner(cls, world: int, options: Options) -> int:
        """Inner ring size of the schedule the analytic counts assume (the plain ring: world)."""
        return world

    @classmethod
    def skipped_bytes(cls, shape: AttnShape, world: int, options: Options, rank: int,
                      mask: Geometry) -> dict[str, int]:
        if not options.skips(mask.relation) or world == 1:
            return super().skipped_bytes(shape, world, options, rank, mask)
        plan = route.plan(world, cls.ring_inner(world, options), rank, mask.need(world))
        return skipped_ring_bytes(shape.kv_heads * shape.kv_unit(world),
                                  shape.kv_heads * shape.kv_grad_unit(world, options), plan)
