"""The gated delta rule over one stretch of tokens: the recurrence of Qwen3-Next's linear layers.

    o, state = delta_rule(q, k, v, g, beta, scale, state0=None, starts=())

Per head, with S a (dk x dv) state: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
and o_t = scale * S_t^T q_t. q, k (b, s, h, dk) (key heads already repeated to the value heads and
l2-normed), v (b, s, h, dv), g (log decay, <= 0) and beta (b, s, h); `state0` (b, h, dk, dv) enters
before the first token (None: zeros); `starts` are the offsets where a document begins, where the
state resets to zero. Returns o (b, s, h, dv) in v's dtype and the state after the last token.

Backends: `torch` (any device, any dtype; chunks of CHUNK tokens solved by the UT transform, the
chunks scanned in order, in float32 at least, float64 for float64 inputs: the exact reference) and
`fla` (flash-linear-attention's chunk_gated_delta_rule: CUDA, bfloat16 / float16 only). `auto`
takes fla where it can run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from seqpar.errors import require

CHUNK = 64  # tokens a chunk: the UT transform solves a CHUNK x CHUNK triangle per chunk
BACKENDS = ("auto", "torch", "fla")
FLA_DTYPES = (torch.bfloat16, torch.float16)  # fla's kernel refuses float32 and float64


@functools.cache
def fla_rule():
    """fla's chunk_gated_delta_rule, or None where flash-linear-attention is not installed (an
    optional GPU extra, imported on first use only)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # type: ignore[import-not-found]
    except ImportError:
        return None
    return chunk_gated_delta_rule


def resolve(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend a call runs: fla on CUDA in 16-bit dtypes where installed, else torch."""
    require(backend in BACKENDS, "linear_backend", backend, f"must be one of {', '.join(BACKENDS)}")
    runs = device.type == "cuda" and dtype in FLA_DTYPES
    if backend == "fla":
        require(runs, "linear_backend", backend,
                f"runs on CUDA in bfloat16 or float16 only (here {device.type}, {dtype})")
        require(fla_rule() is not None, "linear_backend", backend,
                "needs flash-linear-attention (pip install flash-linear-attention)")
        return "fla"
    return "fla" if backend == "auto" and runs and fla_rule() is not None else "torch"


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, scale: float, state0: torch.Tensor | None = None,
               starts: Sequence[int] = (), backend: str = "auto"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a stretch (see the module docstring)."""
    b, s, h, dk = k.shape
    acc = torch.promote_types(v.dtype, torch.float32)
    if state0 is None:
        state0 = torch.zeros(b, h, dk, v.shape[-1], dtype=acc, device=v.device)
    if s == 0:
        return v.new_zeros(v.shape), state0.to(acc)
    bounds = [0, *sorted(set(int(t) for t in starts if 0 < t < s)), s]
    if resolve(backend, v.device, v.dtype) == "fla":
        return _fla(q, k, v, g, beta, scale, state0, bounds)
    outs = []
    state = state0.to(acc)
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if i:  # a document starts: nothing of the state before it reaches it
            state = torch.zeros_like(state)
        o, state = _torch_rule(*(t[:, lo:hi] for t in (q, k, v, g, beta)), scale, state)
        outs.append(o)
    return torch.cat(outs, dim=1).to(v.dtype), state


def _torch_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float, state: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One document's stretch, chunked: within a chunk the UT transform turns the delta rule's
    sequential updates into a triangular solve; the chunks then run in order through the state."""
    acc = state.dtype
    s = q.shape[1]
    pad = -s % CHUNK  # padded tokens (beta 0, g 0) neither write nor decay the state
    q, k, v = (F.pad(t.to(acc), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (q, k, v))
    g, beta = (F.pad(t.to(acc), (0, 0, 0, pad)).transpose(1, 2) for t in (g, beta))
    b, h, n = q.shape[0], q.shape[1], q.shape[2] // CHUNK
    q, k, v = (t.reshape(b, h, n, CHUNK, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(b, h, n, CHUNK).cumsum(-1), beta.reshape(b, h, n, CHUNK)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    # decay[i, j]: the decay from token j to token i of a chunk (0 above the diagonal; masked
    # before exp, so no overflow there and no NaN in its gradient)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb = k * beta[..., None]
    kt = k.transpose(-1, -2)
    tri = ((kb @ kt) * decay).tril(-1)  # (I + tri) is the UT system: unit lower triangular
    u = torch.linalg.solve_triangular(tri, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(tri, kb * g.exp()[..., None], upper=False,
                                      unitriangular=True)
    qs = q * scale
    intra = (qs @ kt) * decay
    q_in = qs * g.exp()[..., None]               # reads the state entering the chunk
    k_out = k * (g[..., -1:] - g).exp()[..., None]  # writes the state leaving it
    last = g[..., -1].exp()[..., None, None]
    outs = []
    for i in range(n):
        fresh = u[:, :, i] - w[:, :, i] @ state  # what the state does not already predict
        outs.append(q_in[:, :, i] @ state + intra[:, :, i] @ fresh)
        state = last[:, :, i] * state + k_out[:, :, i].transpose(-1, -2) @ fresh
    o = torch.stack(outs, dim=2).reshape(b, h, n * CHUNK, -1)[:, :, :s]
    return o.transpose(1, 2), state


def _fla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
         scale: float, state0: torch.Tensor, bounds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's kernel: the batch's rows and their documents as one packed sequence (cu_seqlens), the
    entering state on each row's first document, zeros on the others."""
    b, s = q.shape[:2]
    rule = fla_rule()
    g = g.float()
    if len(bounds) == 2:
        o, state = rule(q, k, v, g, beta.to(q.dtype), scale=scale, initial_state=state0.float(),
                        output_final_state=True)
        return o.to(v.dtype), state
    segs = len(bounds) - 1
    cu = torch.tensor([r * s + t for r in range(b) for t in bounds[:-1]] + [b * s],
                      dtype=torch.long, device=q.device)
    init = state0.float().new_zeros(b, segs, *state0.shape[1:])
    init[:, 0] = state0.float()
    flat = [t.reshape(1, b * s, *t.shape[2:]) for t in (q, k, v, g, beta.to(q.dtype))]
    o, states = rule(*flat, scale=scale, initial_state=init.reshape(b * segs, *state0.shape[1:]),
                     output_final_state=True, cu_seqlens=cu)
    return o.reshape(b, s, *o.shape[2:]).to(v.dtype), states.reshape(b, segs, *states.shape[1:])[:, -1]
