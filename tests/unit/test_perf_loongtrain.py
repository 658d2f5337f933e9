"""The planner against LoongTrain Table 4 (MHA, 64 GPUs): a held-out published table, predicted from
the testbed's stated hardware and the documented FlashAttention-2 efficiency only (clusters.py)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from seqpar import planner
from seqpar.algorithms.base import AttnShape
from seqpar.planner import clusters

TABLE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "loongtrain_table4_mha.csv"


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):  # average ranks of ties
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy)


def table4() -> dict[tuple[str, int], list[tuple[int, float, float]]]:
    """(placement, seq_len) column -> [(dhp, published ms, predicted ms)]."""
    cluster = clusters.load("loongtrain-a100")
    lines = [line for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    cols: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for row in csv.DictReader(lines):
        if row["kind"] != "overall":
            continue
        n, dhp = int(row["seq_len"]), int(row["dhp"])
        shape = AttnShape(1, n, 32, 32, 128, 2)  # LLaMA2-7B attention, bf16
        p = planner.predict(cluster, "usp", shape, 64, nodes=8, layout="zigzag",
                         options={"dhp": dhp, "placement": row["placement"]})
        cols.setdefault((row["placement"], n), []).append((dhp, float(row["ms"]), p.attention_ms))
    return cols


def scores() -> dict[str, object]:
    cols = table4()
    errors, regrets, rhos = [], {}, {}
    for key, rows in cols.items():
        published = [r[1] for r in rows]
        predicted = [r[2] for r in rows]
        errors += [abs(b - a) / a for a, b in zip(published, predicted, strict=True)]
        pick = min(range(len(rows)), key=lambda i: predicted[i])
        regrets[key] = published[pick] / min(published) - 1
        if max(published) / min(published) >= 1.5:
            rhos[key] = spearman(predicted, published)
    return {"mae": statistics.median(errors), "cells": len(errors), "regrets": regrets,
            "spearman": rhos}


@pytest.mark.skipif(not TABLE.is_file(), reason="../shared/data is not here")
def test_loongtrain_table4_targets():
    s = scores()
    assert s["cells"] == 48
    assert s["mae"] <= 0.20, s
    good = sum(r <= 0.05 for r in s["regrets"].values())
    assert good >= 7, s["regrets"]
    assert len(s["spearman"]) >= 4
    assert statistics.mean(s["spearman"].values()) >= 0.8, s["spearman"]


if __name__ == "__main__":  # the numbers for a report
    s = scores()
    print(f"median abs error over {s['cells']} cells: {100 * s['mae']:.1f}%")
    for key, r in s["regrets"].items():
        rho = s["spearman"].get(key)
        print(f"{key[0]:>13} {key[1] // 1024:>5}K  regret {100 * r:5.1f}%  spearman "
              f"{'-' if rho is None else f'{rho:.2f}'}")
    print(f"mean spearman (spread >= 1.5x): {statistics.mean(s['spearman'].values()):.3f}")
