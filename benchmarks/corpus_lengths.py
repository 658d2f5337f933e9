"""`seqpar lengths` on corpora built here from the shipped text (nothing is fetched), four parts:

  exact   a word-level tokenizer (a document of n words is n tokens): `seqpar lengths --out` in
          every format against the counts the corpus was built with; percentiles and shares
          against numpy's on them
  speed   tokens a second of `seqpar lengths` (read from Parquet, streamed, tokenized) against
          `tokenizers`' own `encode_batch_fast` of the same texts held in memory (one call, and in
          seqpar's 1 MiB batches), a BPE trained on the shipped text; best of --repeat
  memory  peak RSS of `seqpar lengths` (a subprocess) on a Parquet corpus 10x its memory budget
          (MEMORY_BUDGET_BYTES: what the streaming pass may hold above its imports)
  plan    `seqpar plan --scope cluster` on a lognormal and on a long-tailed corpus's tokenized
          lengths of the same mean (documents of Pareto-many shipped paragraphs): the best step
          of each SP policy

    .venv/bin/python benchmarks/corpus_lengths.py [--part exact,speed,memory,plan] [--mb 64]

Prints one block per part; the numbers go in the issue note."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import corpora  # noqa: E402

BIN = Path(sys.executable).parent
MEMORY_BUDGET_BYTES = 64 << 20  # the streaming pass's budget above its imports (docs/lengths.md)
PARQUET_ROWS = 1024  # rows a row group (a reader holds one)


def seqpar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "seqpar"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)


def long_docs(total_bytes: int, seed: int, alpha: float = 1.1) -> list[str]:
    """Documents of Pareto(alpha)-many shipped paragraphs (each shuffled word-wise) until
    `total_bytes`: a long tail, as real corpora have."""
    rng = random.Random(seed)
    paragraphs = [p.split() for p in corpora.SHIPPED.read_text().split("\n\n") if p.strip()]
    out, held = [], 0
    while held < total_bytes:
        k = min(4000, int(rng.paretovariate(alpha)))
        words = [w for _ in range(k) for w in rng.choice(paragraphs)]
        rng.shuffle(words)
        doc = " ".join(words)
        out.append(doc)
        held += len(doc)
    return out


def write_parquet(docs: list[str], folder: Path, shards: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // shards)
    for k in range(shards):
        corpora.write(docs[k * per:(k + 1) * per], folder / f"part-{k}.parquet", "parquet",
                      rows_per_group=PARQUET_ROWS)
    return folder


def exact(tmp: Path) -> None:
    from seqpar.corpus import summary

    tok = corpora.word_tokenizer(tmp / "words.json")
    rng = random.Random(0)
    want = [max(1, int(rng.lognormvariate(5, 1.3))) for _ in range(2000)]
    docs = corpora.documents(want, 0)
    ok = []
    for fmt in ("parquet", "jsonl", "json", "arrow", "arrow-stream", "csv", "txt"):
        path = corpora.write(docs, tmp / f"c-{fmt}.{'arrow' if fmt == 'arrow-stream' else fmt}",
                             fmt)
        out = tmp / f"{fmt}.lengths"
        r = seqpar("lengths", str(path), "--tokenizer", str(tok), "--out", str(out), "--json",
                   env={"SEQPAR_CACHE_DIR": str(tmp / "cache")})
        got = [int(x) for x in out.read_text().split()]
        s = json.loads(r.stdout)
        x = np.array(want)
        same = (got == want and [s["p50"], s["p90"], s["p99"]] == np.percentile(
            x, (50, 90, 99)).tolist() and s["max"] == x.max() and s["tokens"] == x.sum())
        ok.append(same)
        print(f"  {fmt:13s} {len(got):5d} documents  lengths {'==' if got == want else '!='} "
              f"built  summary {'==' if same else '!='} numpy's")
    x = np.array(want)
    s = summary.summarize(x)
    print(f"exact: {sum(ok)}/{len(ok)} formats; p50/p90/p99 {s.p50:g}/{s.p90:g}/{s.p99:g}, "
          f"tokens >4K {s.token_share[4096]:.4f} (numpy {x[x > 4096].sum() / x.sum():.4f})")


def speed(tmp: Path, mb: int, repeat: int) -> None:
    from seqpar.corpus import cache
    from seqpar.corpus.tokenize import CHUNK_BYTES, load_tokenizer
    from seqpar.rules.lengths import CorpusRef

    tok_path = corpora.bpe_tokenizer(tmp / "bpe.json", vocab_size=1000)
    docs = long_docs(mb << 20, 1)
    folder = write_parquet(docs, tmp / "speed")
    inner = load_tokenizer(str(tok_path)).inner
    chunks, cur, held = [], [], 0
    for d in docs:
        cur.append(d)
        held += len(d)
        if held >= CHUNK_BYTES:
            chunks.append(cur)
            cur, held = [], 0
    chunks.append(cur)
    best = {"seqpar lengths": 1e9, "encode_batch_fast, one call": 1e9,
            "encode_batch_fast, 1 MiB batches": 1e9}
    tokens = 0
    for i in range(repeat):
        os.environ["SEQPAR_CACHE_DIR"] = str(tmp / f"cache-speed-{i}")
        corpus = cache.open_corpus(CorpusRef(str(folder), str(tok_path)))
        t0 = time.perf_counter()
        cache.tokenize(corpus)
        best["seqpar lengths"] = min(best["seqpar lengths"], time.perf_counter() - t0)
        tokens = corpus.meta()["summary"]["tokens"]
        t0 = time.perf_counter()
        n = sum(len(e) for e in inner.encode_batch_fast(docs, add_special_tokens=False))
        best["encode_batch_fast, one call"] = min(best["encode_batch_fast, one call"],
                                                  time.perf_counter() - t0)
        assert n == tokens, (n, tokens)
        t0 = time.perf_counter()
        for c in chunks:
            inner.encode_batch_fast(c, add_special_tokens=False)
        best["encode_batch_fast, 1 MiB batches"] = min(best["encode_batch_fast, 1 MiB batches"],
                                                       time.perf_counter() - t0)
    print(f"speed: {len(docs):,} documents, {sum(map(len, docs)) / 2**20:.0f} MiB of text, "
          f"{tokens:,} tokens, BPE of {inner.get_vocab_size():,}, {os.cpu_count()} cores, best "
          f"of {repeat}")
    ours = best["seqpar lengths"]
    for name, sec in best.items():
        print(f"  {name:34s} {tokens / sec / 1e6:6.2f} M tokens/s  ({sec:.2f} s; seqpar "
              f"{ours / sec:.2f}x its time)")


def memory(tmp: Path) -> None:
    tok_path = corpora.bpe_tokenizer(tmp / "bpe-mem.json", vocab_size=1000)
    folder = tmp / "memory"
    target = 10 * MEMORY_BUDGET_BYTES
    written, k = 0, 0
    while written < target:  # shard by shard: this process holds one shard's documents
        docs = long_docs(64 << 20, 100 + k)
        write_parquet(docs, folder / f"s{k}", shards=1)
        written += sum(map(len, docs))
        k += 1
    code = ("import resource, sys; from seqpar.cli.app import main; import seqpar.corpus.cache, "
            "tokenizers, pyarrow.parquet; base = resource.getrusage(resource.RUSAGE_SELF)"
            ".ru_maxrss; sys.argv = ['seqpar', 'lengths', sys.argv[1], '--tokenizer', sys.argv[2]"
            ", '--json'];\ntry: main()\nexcept SystemExit: pass\n"
            "print('RSS', base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code, str(folder), str(tok_path)],
                       capture_output=True, text=True,
                       env={**os.environ, "SEQPAR_CACHE_DIR": str(tmp / "cache-mem"),
                            "PYTHONPATH": str(ROOT)})
    base, peak = (int(x) * 1024 for x in r.stdout.split("RSS")[-1].split())
    s = json.loads(r.stdout.split("RSS")[0])
    print(f"memory: {written / 2**20:,.0f} MiB of text ({s['documents']:,} documents, "
          f"{s['tokens']:,} tokens) = {written / MEMORY_BUDGET_BYTES:.1f}x the budget of "
          f"{MEMORY_BUDGET_BYTES >> 20} MiB; peak RSS {peak / 2**20:,.0f} MiB, after the imports "
          f"{base / 2**20:,.0f} MiB: the pass held {(peak - base) / 2**20:,.0f} MiB "
          f"({'within' if peak - base <= MEMORY_BUDGET_BYTES else 'OVER'} budget) in "
          f"{s['seconds']:.0f} s")


def plan(tmp: Path) -> None:
    tok_path = corpora.bpe_tokenizer(tmp / "bpe-plan.json", vocab_size=1000)
    folder = write_parquet(long_docs(24 << 20, 7, alpha=0.9), tmp / "plan")
    env = {"SEQPAR_CACHE_DIR": str(tmp / "cache-plan")}
    s = json.loads(seqpar("lengths", str(folder), "--tokenizer", str(tok_path), "--json",
                          env=env).stdout)
    x = np.loadtxt(s["lengths_file"], dtype=np.int64)
    sigma = float(np.log(x).std())
    lognormal = (f"lognormal:mean={round(float(x.mean()))},sigma={sigma:.2f},min=1,"
                 f"max={int(x.max())}")
    print(f"plan: corpus {s['documents']:,} documents, mean {s['mean']:,.0f}, p50 {s['p50']:,.0f},"
          f" p99 {s['p99']:,.0f}, max {s['max']:,}; tokens >32K {s['tokens_over_32k']:.1%}, "
          f"work >32K {s['work_over_32k']:.1%}; the lognormal of its mean and log-sigma: "
          f"{lognormal}")
    common = ["plan", "--scope", "cluster", "--cluster", "h100-sxm", "--model", "llama3.1-8b",
              "--world", "64", "--nodes", "8", "--seq-len", "131072", "--tokens-per-step",
              "2097152", "--capacity", "16384", "--json", "--top", "0"]
    for name, form in (("lognormal", lognormal), ("corpus", f"corpus:{folder}?tokenizer={tok_path}")):
        t0 = time.perf_counter()
        r = seqpar(*common, "--lengths", form, env=env)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        by_policy: dict[str, dict] = {}
        for c in (c for c in got["configs"] if c["fits"]):  # best first
            key = (f"static {c['dp']}x{c['sp']}" if c["sp_policy"] == "static" else "dynamic")
            by_policy.setdefault(key, c)
        print(f"  {name} ({time.perf_counter() - t0:.1f} s, capacity {got['capacity']:,}):")
        shown = list(by_policy)[:3] + [k for k in list(by_policy)[3:] if k == "dynamic"]
        for key, c in ((k, by_policy[k]) for k in shown):
            p = c["predicted"]
            print(f"    {key:14s} {c['algorithm']:10s} {c['packing'] or c['degrees'] or '':13s} step "
                  f"{p['step_ms']:,.0f} ms  TGS {p['tgs']:,.0f}  imbalance {p['imbalance']:.2f}  "
                  f"idle {p['parts_ms']['idle']:,.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="exact,speed,memory,plan")
    ap.add_argument("--mb", type=int, default=64, help="MiB of text for the speed part")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ.setdefault("SEQPAR_CACHE_DIR", str(tmp / "cache"))
        for part in args.part.split(","):
            t0 = time.perf_counter()
            {"exact": lambda: exact(tmp), "speed": lambda: speed(tmp, args.mb, args.repeat),
             "memory": lambda: memory(tmp), "plan": lambda: plan(tmp)}[part]()
            print(f"  ({part}: {time.perf_counter() - t0:.0f} s; load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
    _ = resource  # the memory part's child reads its own peak


if __name__ == "__main__":
    main()
