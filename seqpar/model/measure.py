"""One-process measurements of the model's memory levers, each against its analytic count.

- `checkpoint_bytes`: bytes one block keeps for backward under each checkpointing mode (measured as
  the difference between a 1- and a 3-layer model, halved, so embedding and head cancel) next to the
  analytic count, and the time a forward + backward takes (recompute cost = time - time of `none`).
- `head_memory`: peak memory of the LM head + loss forward, fused vs unfused, next to N x V x e.

    PYTHONPATH=. python -m seqpar.model.measure
"""

from __future__ import annotations

import dataclasses
import gc
import time

import torch

from seqpar.model import checkpointing, flops, head
from seqpar.model.config import ModelConfig
from seqpar.model.memory import AllocationMeter
from seqpar.model.transformer import Transformer


def with_layers(cfg: ModelConfig, n: int) -> ModelConfig:
    """`cfg` with n layers, layer i of the kind of cfg's layer i mod cfg.layers."""
    def like(i: int, layers: tuple[int, ...]) -> bool:
        return i % cfg.layers in layers

    return dataclasses.replace(
        cfg, layers=n, layer_types=tuple(cfg.layer_types[i % cfg.layers] for i in range(n)),
        nope_layers=tuple(i for i in range(n) if like(i, cfg.nope_layers)),
        moe_layers=tuple(i for i in range(n) if like(i, cfg.moe_layers)) if cfg.experts else ())


def _retained(cfg: ModelConfig, tokens: torch.Tensor, mode: str, fraction: float,
              dtype: torch.dtype) -> int:
    net = Transformer(cfg, checkpoint=mode, seq_fraction=fraction, dtype=dtype)
    gc.collect()
    with AllocationMeter() as mem:
        loss = net.loss(tokens)
    del loss
    return mem.retained


def analytic_block_bytes(cfg: ModelConfig, batch: int, s: int, mode: str, fraction: float,
                         elem: int, none_bytes: int) -> int:
    """What one block keeps: full -> its input x; sc++ -> x + attention out + lse; sequence(f) ->
    the attention's saved state + x + (1 - f) of the rest of `none`; sc++,sequence(f) -> x + out +
    lse + (1 - f) of the rest (plus, when batch > 1, the copy the kept part's output projection
    makes of its non-contiguous slice of the attention output); seq-attn(f) -> x + out and lse of
    the (1 - f) of the tokens after the prefix. `none_bytes` is the measured `none` block (its own
    count is the sum of what every op saves)."""
    tok = batch * s * elem
    x, out, lse = tok * cfg.hidden, tok * cfg.heads * cfg.head_dim, tok * cfg.heads
    attn = 2 * out + 2 * tok * cfg.kv_heads * cfg.head_dim + lse  # q, out, k, v, lse
    m = checkpointing.recomputed_tokens(mode, fraction, s)
    after = s - int(round(fraction * s))  # seq-attn: the tokens whose out and lse are kept
    rest = (none_bytes - attn - x) * (s - m) / s
    if batch > 1 and 0 < m < s:  # the kept part's O-projection input is a copy of its slice of out
        rest += out * (s - m) / s
    return {"none": none_bytes, "full": x, "sc++": x + out + lse,
            "sequence": int(attn + x + rest), "sc++,sequence": int(x + out + lse + rest),
            "seq-attn": x + (out + lse) * after // s}[mode]


def checkpoint_bytes(cfg: ModelConfig, batch: int = 2, seq_len: int = 64, fraction: float = 0.5,
                     dtype: torch.dtype = torch.float64, repeats: int = 3) -> list[dict]:
    """Per mode: measured and analytic bytes per block, and the best of `repeats` step times (s),
    the modes interleaved round by round so that a busy machine slows them alike."""
    tokens = torch.randint(0, cfg.vocab, (batch, seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    elem = torch.empty((), dtype=dtype).element_size()
    rows, none = [], None
    for mode in checkpointing.CHECKPOINT_MODES:
        per = [_retained(with_layers(cfg, n), tokens, mode, fraction, dtype)
               for n in (1, 3)]
        measured = (per[1] - per[0]) // 2
        none = measured if mode == "none" else none
        rows.append({"mode": mode, "fraction": fraction, "measured": measured,
                     "analytic": analytic_block_bytes(cfg, batch, seq_len, mode, fraction, elem,
                                                      none)})
    nets = [Transformer(cfg, checkpoint=r["mode"], seq_fraction=fraction, dtype=dtype) for r in rows]
    times: list[list[float]] = [[] for _ in rows]
    for _ in range(repeats):
        for net, series in zip(nets, times, strict=True):
            t0 = time.perf_counter()
            net.loss(tokens).backward()
            series.append(time.perf_counter() - t0)
    for r, series in zip(rows, times, strict=True):
        r["step_s"] = min(series)
        r["recompute_s"] = r["step_s"] - min(times[0])
    return rows


def head_memory(tokens: int, hidden: int, vocab: int, token_tile: int = 256,
                vocab_tile: int = 2048, dtype: torch.dtype = torch.float32) -> dict:
    """Peak bytes of the head + loss forward, unfused and fused, and the logits' N x V x e."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=gen, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, dtype=dtype) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    row = {"tokens": tokens, "hidden": hidden, "vocab": vocab,
           "logits_bytes": tokens * vocab * h.element_size()}
    for name, fn in (("unfused", head.unfused_loss_sum),
                     ("fused", lambda a, b, c: head.fused_loss_sum(a, b, c, token_tile, vocab_tile))):
        gc.collect()
        with AllocationMeter() as mem:
            loss = fn(h, w, labels)
        t0 = time.perf_counter()
        loss.backward()
        row[f"{name}_peak"], row[f"{name}_retained"] = mem.peak, mem.retained
        row[f"{name}_backward_s"] = time.perf_counter() - t0
        del loss
        h.grad = w.grad = None
    row["saved"] = row["unfused_peak"] - row["fused_peak"]
    return row


def main() -> None:
    cfg = ModelConfig(vocab=512, hidden=128, layers=2, heads=8, kv_heads=2, ffn=344)
    print("checkpointing, bytes per block (B=1, N=512, float32, one process, local attention; "
          "step = forward + backward of the 2-layer model, best of 7 interleaved)")
    torch.set_num_threads(1)
    for r in checkpoint_bytes(cfg, batch=1, seq_len=512, dtype=torch.float32, repeats=7):
        recomputed = flops.recomputed_flops(cfg, 1, 512, 1, r["mode"], r["fraction"])
        print(f"  {r['mode']:>14} f={r['fraction']}: measured {r['measured']:>8} analytic "
              f"{r['analytic']:>8}  step {r['step_s'] * 1e3:7.1f} ms  recompute "
              f"{r['recompute_s'] * 1e3:+7.1f} ms  recomputed {recomputed / 1e6:6.1f} MFLOP")
    print("LM head + loss forward, float32, peak bytes")
    for vocab in (8192, 32768):
        r = head_memory(1024, 64, vocab)
        print(f"  V={vocab}: peak unfused {r['unfused_peak']:>10} fused {r['fused_peak']:>10} lower by "
              f"{r['saved']:>10} = {r['saved'] / r['logits_bytes']:.2f} x N*V*4 ({r['logits_bytes']}); "
              f"kept for backward unfused {r['unfused_retained']} fused {r['fused_retained']}")


if __name__ == "__main__":
    main()
