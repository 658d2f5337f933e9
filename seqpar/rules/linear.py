"""A linear-attention layer (gated DeltaNet) under LASP: the bytes each rank sends and the FLOPs it
does, no torch. `algorithms.lasp` executes these rules; the planner and the ledger tests read them.

Per layer and rank r of P (u: one state, b x Hv x dk x dv values; e_s: the state's element bytes,
float32 at least, as the rule keeps it; halo: b x (kernel - 1) x conv_dim activations):

    lasp2  forward   all-gather of the (A, B) pairs: (P-1) b Hv dk (dk + dv) e_s + halo to r+1
           backward  reduce-scatter of their gradients: the same (P-1) pairs + the halo's gradient to r-1
    lasp1  forward   S_out to r+1: u e_s (r < P-1) + halo to r+1
           backward  dS_in to r-1: u e_s (r > 0) + the halo's gradient to r-1

Neither depends on the sequence length or the documents (a rank where a document starts still sends
its pair, or a zero state gradient): LASP-2 sends (dk + dv) / dv x P-1 states a rank in one
collective, LASP-1 one state a rank in P-1 dependent steps. Only a call whose shards are shorter
than the halo (floor(n / P) < kernel - 1: a pack of a few tokens) all-gathers every rank's last
rows instead, (P-1) halos a rank each way (`halo_gathered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from seqpar.errors import require
from seqpar.rules.shape import PHASES

if TYPE_CHECKING:
    from seqpar.rules.model import ModelConfig

LASP_MODES = ("lasp2", "lasp1")  # all-gather of pairs (one collective) | a ring of states (serial)
CHUNK = 64  # the chunked rule's tokens a chunk (algorithms.delta_rule.CHUNK)


def check_lasp(cfg: ModelConfig, layout: str, world: int, linear_sp: str | None = None) -> str | None:
    """LASP's rules for `cfg` on `world` ranks dealt in `layout`, checkable before any rank
    starts; the mode its linear layers run (None: the model has none)."""
    linear = "linear" in cfg.layer_types
    require(linear_sp is None or linear, "linear_sp", linear_sp,
            f"applies to linear-attention layers, and this {cfg.family} model has none "
            "(model.layer_types)")
    if not linear:
        return None
    mode = linear_sp or "lasp2"
    require(mode in LASP_MODES, "linear_sp", mode, f"must be one of {', '.join(LASP_MODES)}")
    require(world == 1 or layout == "contiguous", "layout", layout,
            "must be contiguous for a model with linear-attention layers under SP (LASP passes "
            "one state a rank; zigzag, stripe and balanced shards hold several stretches)")
    return mode


@dataclass(frozen=True)
class LinearShape:
    """One linear layer's call: `batch` rows, the layer's heads and dims, `elem` bytes an
    activation (the halo's), the state's bytes an element float32 at least."""

    batch: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    elem: int

    @classmethod
    def of(cls, cfg: ModelConfig, batch: int, elem: int) -> LinearShape:
        return cls(batch, cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, cfg.lin_v_dim,
                   cfg.conv_kernel, elem)

    @property
    def state_elem(self) -> int:
        return max(self.elem, 4)

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def state_bytes(self) -> int:
        return self.batch * self.v_heads * self.k_dim * self.v_dim * self.state_elem

    @property
    def pair_bytes(self) -> int:
        """A rank's (A, B): the transition (dk x dk) beside the state (dk x dv), every head."""
        return self.batch * self.v_heads * self.k_dim * (self.k_dim + self.v_dim) * self.state_elem

    @property
    def halo_bytes(self) -> int:
        return self.batch * (self.conv_kernel - 1) * self.conv_dim * self.elem


def halo_gathered(seq_len: int, world: int, width: int) -> bool:
    """Whether the convolution's halo is all-gathered: a shard (contiguous: floor(n / P) tokens
    the shortest) holds fewer than its `width` (kernel - 1) tokens, so the previous rank alone
    does not have them (a pack of a few tokens; never at training lengths)."""
    return world > 1 and seq_len // world < width


def lasp_bytes_by_op(mode: str, shape: LinearShape, world: int, rank: int,
                     seq_len: int | None = None) -> dict[tuple[str, str], int]:
    """{(op, phase): bytes} rank `rank` of `world` sends in one linear layer's call (of
    `seq_len` tokens: only a call too short for the halo's point-to-point needs it)."""
    if world == 1:
        return {}
    out: dict[tuple[str, str], int] = {}

    def add(op: str, phase: str, n: int) -> None:
        out[(op, phase)] = out.get((op, phase), 0) + n

    if seq_len is not None and halo_gathered(seq_len, world, shape.conv_kernel - 1):
        add("all_gather", "forward", (world - 1) * shape.halo_bytes)
        add("reduce_scatter", "backward", (world - 1) * shape.halo_bytes)
    else:
        add("p2p", "forward", shape.halo_bytes if rank < world - 1 else 0)
        add("p2p", "backward", shape.halo_bytes if rank > 0 else 0)
    if mode == "lasp2":
        add("all_gather", "forward", (world - 1) * shape.pair_bytes)
        add("reduce_scatter", "backward", (world - 1) * shape.pair_bytes)
    else:
        add("p2p", "forward", shape.state_bytes if rank < world - 1 else 0)
        add("p2p", "backward", shape.state_bytes if rank > 0 else 0)
    return out


def lasp_bytes(mode: str, shape: LinearShape, world: int, rank: int,
               seq_len: int | None = None) -> dict[str, int]:
    """{phase: bytes} rank `rank` sends in one linear layer's call (`lasp_bytes_by_op` summed)."""
    out = dict.fromkeys(PHASES, 0)
    for (_, phase), n in lasp_bytes_by_op(mode, shape, world, rank, seq_len).items():
        out[phase] += n
    return out


def delta_rule_flops(shape: LinearShape, tokens: int, augmented: bool = False) -> float:
    """Forward FLOPs of the chunked rule over `tokens` of one row: per chunk of C and head, the
    UT system and the query-key products (4 C^2 dk), the triangular solves (C^2 (dk + dv)), the
    intra-chunk output (2 C^2 dv) and the state's read, write and output (6 C dk dv); `augmented`:
    LASP-2's pass over values [0 | v] (dv -> dk + dv). Backward: twice this."""
    dk = shape.k_dim
    dv = shape.v_dim + (dk if augmented else 0)
    per_token = CHUNK * (5 * dk + 3 * dv) + 6 * dk * dv
    return float(shape.batch * shape.v_heads * tokens * per_token)


def lasp_flops(mode: str, shape: LinearShape, tokens: int, world: int, rank: int) -> float:
    """Forward FLOPs of rank `rank`'s rule over its `tokens`: LASP-2 runs the augmented pass, then
    applies the earlier ranks' pairs (2 dk^2 dv a pair and head) and adds reach x S_in
    (2 dk dv a token and head); LASP-1 (and one rank) the plain pass."""
    if world == 1 or mode == "lasp1":
        return delta_rule_flops(shape, tokens)
    dk, dv = shape.k_dim, shape.v_dim
    heads = shape.batch * shape.v_heads
    scan = rank * 2 * dk * dk * dv * heads
    return delta_rule_flops(shape, tokens, augmented=True) + scan + 2 * dk * dv * heads * tokens
