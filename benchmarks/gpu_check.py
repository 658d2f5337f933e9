"""`make gpu-check` in one script: the attention algorithms and the model on this machine's GPUs,
with nothing but torch (and numpy) besides seqpar's torch-only layers.

    python benchmarks/gpu_check.py                       # from a checkout: every GPU, one summary
    python benchmarks/gpu_check.py --install-flash-attn  # first try a flash-attn wheel (make gpu-check)
    python benchmarks/gpu_check.py --device cpu --world 2 --quick   # the same code on CPU ranks

Sections, on `--world` ranks (default: one per GPU; NCCL on CUDA, gloo on the CPU):
1. the machine: torch, CUDA, GPUs, flash-attn (its version, or why it does not run), torch's flash
   and cuDNN kernels, and the kernel `auto` picks per dtype and head dim;
2. check: every algorithm x layout x causal/full x MHA/GQA in bfloat16 and float16 (float32 and
   bfloat16 on the CPU), output and gradients against float64 attention on the unsharded inputs;
3. accuracy: packed documents, a sliding window, GQA, head dims 128 and 72, every algorithm;
4. training: a small decoder over {replicated, fsdp} x every checkpoint mode x fused head, bf16
   with fp32 master weights (float32 on the CPU), AdamW: every loss finite, the losses of every
   mode equal step by step, memory positive.
It imports only torch, numpy and `seqpar.algorithms` / `seqpar.model` (no Ray, MLflow, pydantic,
flash-attn unless installed) and says so; exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

try:
    import seqpar  # noqa: F401
except ImportError:  # a bare checkout: seqpar from the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from seqpar.algorithms import REGISTRY, build_attention, kernels, layouts  # noqa: E402
from seqpar.errors import SeqparError  # noqa: E402
from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer  # noqa: E402
from seqpar.model.memory import state_bytes  # noqa: E402
from seqpar.rules.shape import TOLERANCE  # noqa: E402

NOT_TORCH_ONLY = ("ray", "mlflow", "pydantic", "typer", "rich", "yaml", "scipy", "pandas")
# max |x - ref| / max |ref| this check holds each dtype to (seqpar's tolerances, per dtype)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ------------------------------------------------------------------------------ attention checks
def _options(name: str, world: int, heads: int) -> dict:
    """Options that make an algorithm do its distributed thing at this world size."""
    if name == "usp" and world % 2 == 0 and heads % 2 == 0:
        return {"dhp": 2}
    if name == "double_ring" and world % 2 == 0 and world > 2:
        return {"inner_ring": 2}
    return {}


def _reference(q, k, v, dout, causal, cu, window):
    """out, dq, dk, dv in float64 of one-process attention under the explicit mask."""
    n = q.shape[1]
    pos = torch.arange(n, device=q.device)
    keep = torch.ones(n, n, dtype=torch.bool, device=q.device)
    if cu is not None:
        doc = torch.bucketize(pos, torch.tensor(cu[1:], device=q.device), right=True)
        keep &= doc[:, None] == doc[None, :]
    if causal:
        keep &= pos[:, None] >= pos[None, :]
    if window is not None:
        keep &= (pos[:, None] - pos[None, :]).abs() < window
    g = q.shape[2] // k.shape[2]
    x = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(
        x[0].transpose(1, 2), x[1].repeat_interleave(g, 2).transpose(1, 2),
        x[2].repeat_interleave(g, 2).transpose(1, 2), attn_mask=keep).transpose(1, 2)
    out.backward(dout.double())
    return [out.detach(), *(t.grad for t in x)]


def _case(world, rank, device, name, layout, causal, heads, kv_heads, head_dim, dtype, cu=None,
          window=None, seed=0):
    """The largest relative error of out, dq, dk, dv over this rank's shard (None: the algorithm
    refuses this case, with why)."""
    n = 128 * world if cu is None else cu[-1]
    gen = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(1, n, heads, head_dim, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, n, kv_heads, head_dim, generator=gen) for _ in range(2))
    ref = _reference(*(t.to(device) for t in (q, k, v, dout)), causal, cu, window)
    group = dist.group.WORLD if world > 1 else None
    try:
        attn = build_attention(name, causal=causal, layout=layout, group=group, window=window,
                               **_options(name, world, heads))
    except SeqparError as err:
        return None, str(err)
    pos = layouts.positions(layout, rank, world, n, cu).to(device)
    local = [t.to(device=device, dtype=dtype).index_select(1, pos).requires_grad_()
             for t in (q, k, v)]
    out = attn(*local, **({} if cu is None else {"cu_seqlens": cu}))
    out.backward(dout.to(device=device, dtype=dtype).index_select(1, pos))
    worst = 0.0
    for got, want in zip([out, *(t.grad for t in local)], ref, strict=True):
        want = want.index_select(1, pos)
        scale = max(float(want.abs().max()), 1e-4)
        worst = max(worst, float((got.detach().double() - want).abs().max()) / scale)
    return worst, None


def _attention_rows(world, rank, device, dtypes, quick, names):
    """(section, label, error, bound, note) of the check and accuracy sweeps on this rank."""
    rows = []
    layouts_ = ("zigzag",) if quick else layouts.LAYOUTS
    for dtype, name, layout, causal, kv in itertools.product(
            dtypes, names, layouts_, (True,) if quick else (True, False), (8, 2)):
        if name == "local" and world > 1:
            continue
        err, why = _case(world, rank, device, name, layout, causal, 8, kv, 64, DTYPES[dtype])
        rows.append(("check", f"{name} {layout} {'causal' if causal else 'full'} H=8 Hkv={kv} "
                     f"D=64 {dtype}", err, TOLERANCE[dtype], why))
    dtype = dtypes[-1]  # the 16-bit one
    for name, head_dim, what in itertools.product(names, (72,) if quick else (128, 72),
                                                  ("documents", "window")):
        if name == "local" and world > 1:
            continue
        n = 128 * world + 3 * world  # uneven documents, shards of any length
        cu = (0, n // 5, n // 2 + 1, n) if what == "documents" else None
        err, why = _case(world, rank, device, name, "zigzag", True, 8, 2, head_dim, DTYPES[dtype],
                         cu=cu if cu else (0, 128 * world), window=None if cu else 33, seed=1)
        rows.append(("accuracy", f"{name} zigzag {what} GQA 8/2 D={head_dim} {dtype}", err,
                     TOLERANCE[dtype], why))
    return rows


# ------------------------------------------------------------------------------------- training
TRAIN_CFG = ModelConfig(vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, ffn=688)


def _train_rows(world, rank, device, dtype, master, quick, steps=3):
    """(states, checkpoint, fused, losses, memory bytes) of each training run on this rank."""
    algorithm = "ring" if world > 1 else "local"
    n = 256 * world
    tokens = [torch.randint(0, TRAIN_CFG.vocab, (2, n + 1), generator=torch.Generator()
                            .manual_seed(s)) for s in range(steps)]
    modes = ("none", "sc++") if quick else CHECKPOINT_MODES
    runs = []
    combos = list(itertools.product(("replicated", "fsdp"), modes, (False, True)))
    if quick:  # every pair of two factors' values once, in half the runs (odd parity)
        combos = [(s, m, f) for s, m, f in combos if (s == "fsdp") ^ (m == "sc++") ^ f]
    for states, mode, fused in combos:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        net = Transformer(TRAIN_CFG, attention=algorithm, layout="zigzag",
                          group=dist.group.WORLD, checkpoint=mode, fused_head=fused, seed=5,
                          dtype=dtype, master_dtype=master, states=states, device=device,
                          head_tiles=(256, 128))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        losses = []
        for t in tokens:
            loss = net.loss(t)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        memory = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                  else state_bytes(net, opt))  # the host: this rank's states (fsdp: its shards)
        runs.append((states, mode, fused, losses, memory))
        del net, opt
    return runs


# ------------------------------------------------------------------------------------- the ranks
def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            device_id=device if cuda else None)
    try:
        dtypes = ("bfloat16", "float16") if cuda else ("float32", "bfloat16")
        result = {"attention": _attention_rows(world, rank, device, dtypes, args.quick,
                                               args.algorithms)}
        if not args.no_train:
            dtype, master = (torch.bfloat16, torch.float32) if cuda else (torch.float32, None)
            result["train"] = _train_rows(world, rank, device, dtype, master, args.quick)
        result["imports"] = sorted({m.split(".")[0] for m in sys.modules} & set(NOT_TORCH_ONLY))
        queue.put((rank, result))
    except BaseException:  # noqa: BLE001 (every failure goes to the summary)
        queue.put((rank, {"error": traceback.format_exc()}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- machine and summary
def install_flash_attn() -> str:
    """pip-install flash-attn only where a prebuilt wheel fits this torch (no compile); remove it
    again if it does not import. Returns what happened, in one line."""
    env = {**os.environ, "FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "flash-attn"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "flash-attn: pip install timed out; running without it"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"flash-attn: no wheel installed ({last[:160]}); running without it"
    probe = subprocess.run([sys.executable, "-c", "import flash_attn.flash_attn_interface"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "flash-attn"])
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return (f"flash-attn: the wheel does not fit this torch ({last[:160]}); removed, running "
                "without it")
    return "flash-attn: installed a prebuilt wheel"


def machine(device: str) -> list[str]:
    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}"]
    fa = kernels.flash_attn()
    why = kernels.flash_import_error()
    lines.append(f"flash-attn {getattr(sys.modules.get('flash_attn'), '__version__', '?')}" if fa
                 else f"flash-attn: {'does not import: ' + why if why else 'not installed'}")
    if device == "cuda":
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            lines.append(f"cuda:{i} {torch.cuda.get_device_name(i)} sm_{cap[0]}{cap[1]}")
        lines.append(f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, torch flash "
                     f"kernel built: {torch.backends.cuda.is_flash_attention_available()}")
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    for dtype in ("bfloat16", "float16", "float32"):
        chosen = []
        for d in (64, 72, 128):
            try:
                chosen.append(f"D={d} {kernels.kernel_name('auto', dev, DTYPES[dtype], head_dim=d)}")
            except SeqparError as err:
                chosen.append(f"D={d} {err}")
        lines.append(f"auto kernel, {dtype}: " + ", ".join(chosen))
    return lines


def summary(results: dict, world: int, device: str) -> tuple[list[str], bool]:
    failed = [f"rank {r}: {res['error']}" for r, res in results.items() if "error" in res]
    if failed:
        return failed, False
    lines, ok = [], True
    rows = [r for r in results[0]["attention"]]
    for rank in range(1, world):  # the worst over ranks
        rows = [(a[0], a[1], None if a[2] is None else max(a[2], b[2]), a[3], a[4])
                for a, b in zip(rows, results[rank]["attention"], strict=True)]
    for section in ("check", "accuracy"):
        mine = [r for r in rows if r[0] == section]
        bad = [r for r in mine if r[2] is not None and r[2] > r[3]]
        ran = [r for r in mine if r[2] is not None]
        worst = max(ran, key=lambda r: r[2] / r[3]) if ran else None
        lines.append(f"{section}: {len(ran) - len(bad)}/{len(ran)} within bounds, "
                     f"{len(mine) - len(ran)} refused" + (
                         f"; worst {worst[2]:.2e} (bound {worst[3]:.0e}): {worst[1]}" if worst else ""))
        lines += [f"  FAIL {r[1]}: {r[2]:.2e} > {r[3]:.0e}" for r in bad]
        ok &= not bad
    if "train" in results[0]:
        runs = results[0]["train"]
        held = "peak allocated" if device == "cuda" else "states held"
        first = runs[0][3]
        for states, mode, fused, losses, memory in runs:
            finite = all(torch.isfinite(torch.tensor(losses)))
            equal = all(abs(a - b) <= 2e-2 * abs(b) for a, b in zip(losses, first, strict=True))
            mark = "ok" if finite and equal and memory > 0 else "FAIL"
            ok &= mark == "ok"
            lines.append(f"train {mark}: {states:10} ckpt={mode:13} fused={str(fused):5} losses "
                         + " ".join(f"{x:.4f}" for x in losses) + f"  {held} {memory / 2**20:.1f} MiB")
    here = {m.split(".")[0] for m in sys.modules} & set(NOT_TORCH_ONLY)
    imports = sorted(here | {m for res in results.values() for m in res["imports"]})
    lines.append("imports: torch-only" if not imports else f"imports: NOT torch-only: {imports}")
    return lines, ok and not imports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--world", type=int, default=None, help="ranks (default: GPUs, or 2)")
    parser.add_argument("--quick", action="store_true", help="a covering subset (tests)")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--install-flash-attn", action="store_true")
    parser.add_argument("--algorithms", default=",".join(sorted(REGISTRY)),
                        help="comma-separated (default: every registered algorithm)")
    args = parser.parse_args(argv)
    args.algorithms = args.algorithms.split(",")
    unknown = sorted(set(args.algorithms) - set(REGISTRY))
    if unknown:
        print(f"gpu-check: --algorithms {unknown}: not among {sorted(REGISTRY)}")
        return 2
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    world = args.world or (gpus if args.device == "cuda" else 2)
    if args.device == "cuda" and not 1 <= world <= gpus:
        print(f"gpu-check: --world {world} needs that many GPUs; this machine has {gpus}")
        return 2
    start = time.perf_counter()
    lines = [install_flash_attn()] if args.install_flash_attn else []
    lines += machine(args.device)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    more, ok = summary(results, world, args.device)
    lines += more
    lines.append(f"gpu-check {'PASSED' if ok else 'FAILED'}: {world} {args.device} rank(s), "
                 f"{time.perf_counter() - start:.0f} s")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
