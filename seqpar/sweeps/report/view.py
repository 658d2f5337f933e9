"""Typed views over a sweep (`SweepView`) and its trial runs (`TrialView`): parameters parsed once
from MLflow's strings, so the table, the figures and the summary read fields (`t.seq_len`,
`t.window`), never `params["..."]` keys. A view is made from a run as the sweep runner logged it
(in memory: a finished sweep's report) or as the store returns it (an old sweep)."""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqpar.platform.tracking import RunRecord, Tracker


def _text(params: dict[str, str], key: str) -> str | None:
    """A param as logged; None when absent or logged as None."""
    value = params.get(key)
    return None if value in (None, "", "None") else value


def _as_int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _int(params: dict[str, str], key: str) -> int:
    return _as_int(params.get(key))


def _opt_int(params: dict[str, str], key: str) -> int | None:
    value = _text(params, key)
    return int(value) if value is not None else None


@dataclass(frozen=True)
class Documents:
    """Packed documents: drawn (count, spread, seed) or given (lengths)."""
    count: int | None = None
    spread: str | None = None
    seed: int | None = None
    given: int | None = None  # how many lengths were given

    @property
    def short(self) -> str:
        """'12 drawn (spread 1.25, seed 0)' or '3 given'."""
        if self.count is not None:
            return f"{self.count} drawn (spread {self.spread}, seed {self.seed})"
        return f"{self.given} given"


@dataclass(frozen=True)
class Training:
    """A model-training trial's memory levers and its DP x SP split."""
    model: str
    dp: int
    checkpoint: str
    seq_fraction: str | None
    fused_head: bool
    vocab: str | None
    states: str = "replicated"
    layers: str = ""  # an MLA ring's pass and a hybrid's LASP where set: " mla_pass=latent lasp2"
    ep: int = 1       # expert parallelism's group size (plan.ep)

    def label(self, world: int) -> str:
        ckpt = self.checkpoint
        if "sequence" in ckpt or ckpt == "seq-attn":
            ckpt += f"({self.seq_fraction})"
        head = " fused-head" if self.fused_head else ""
        vocab = f" V={self.vocab}" if self.vocab is not None else ""
        states = f" {self.states}" if self.states != "replicated" else ""
        ep = f" EP={self.ep}" if self.ep > 1 else ""
        return (f"SP={world // max(self.dp, 1)} DP={self.dp}{ep} ckpt={ckpt}{head}{vocab}{states}"
                f"{self.layers}")


@dataclass(frozen=True)
class TrialView:
    """One trial run as the report reads it."""
    run_id: str
    name: str
    status: str
    algorithm: str
    options: tuple[tuple[str, str], ...]
    world: int                 # 0 when not logged
    nodes: str | None
    layout: str | None
    seq_len: int               # 0 when not logged
    heads: int | None
    kv_heads: int | None
    dtype: str | None
    causal: bool
    window: int | None         # the sliding window W; None: none
    documents: Documents | None
    training: Training | None
    cores: int | None          # cores of the machine the ranks shared, if recorded
    device: str | None         # None: not recorded
    topology: str
    cause: str                 # why it failed, if it did
    headline: str | None       # the metric its sweep ranks by
    metrics: dict[str, float] = field(default_factory=dict)
    unstable: str | None = None  # why its step time cannot be trusted (tag seqpar.unstable)
    experiment_id: str = ""      # its MLflow experiment
    mask_spec: str | None = None  # workload.mask's compact form (any mask); None: causal/full
    lengths: str | None = None    # workload.lengths (a step of sequences); None: one sequence
    sp_policy: str | None = None  # with lengths: static | dynamic
    packing: str | None = None    # with lengths, static: best-fit | cost-balanced
    equal_counts: bool = False    # with lengths, dynamic: every rank as many micro-batches
    degrees: str | None = None    # with lengths, dynamic: smallest | cost (group sizes)

    @classmethod
    def of(cls, run: RunRecord) -> TrialView:
        p, tags = run.params, run.tags
        docs = None
        if _text(p, "workload.documents.count") is not None:
            docs = Documents(count=_int(p, "workload.documents.count"),
                             spread=p.get("workload.documents.spread"),
                             seed=_opt_int(p, "workload.documents.seed"))
        elif (lengths := _text(p, "workload.documents.lengths")) is not None:
            docs = Documents(given=len(lengths.strip("[]").split(",")))
        training = None
        if "train.model" in p:
            training = Training(p["train.model"], _int(p, "train.dp"), p.get("train.checkpoint", ""),
                                p.get("train.seq_fraction"), p.get("train.fused_head") == "True",
                                _text(p, "train.vocab"), p.get("train.states") or "replicated",
                                (" mla_pass=latent" if p.get("train.mla_pass") == "latent" else "")
                                + (f" {p['train.linear_sp']}" if _text(p, "train.linear_sp") else ""),
                                _opt_int(p, "plan.ep") or 1)
        try:
            cores = int(tags["seqpar.cpu_count"])
        except (KeyError, ValueError):
            cores = None
        return cls(
            run.run_id, run.name, run.status, p.get("plan.algorithm", "?"),
            tuple(sorted((k.removeprefix("plan.options."), v) for k, v in p.items()
                         if k.startswith("plan.options."))),
            _int(p, "plan.world"), p.get("plan.nodes"), p.get("plan.layout"),
            _int(p, "workload.seq_len"), _opt_int(p, "model.heads"), _opt_int(p, "model.kv_heads"),
            p.get("workload.dtype"), p.get("workload.causal", "True") == "True",
            _opt_int(p, "workload.window"), docs, training, cores,
            tags.get("seqpar.device"), tags.get("seqpar.topology", "virtual"),
            tags.get("seqpar.cause", ""), tags.get("seqpar.headline"), dict(run.metrics),
            tags.get("seqpar.unstable"), run.experiment_id, _text(p, "workload.mask"),
            _text(p, "workload.lengths"), _text(p, "plan.sp_policy"), _text(p, "plan.packing"),
            p.get("plan.equal_counts") == "True", _text(p, "plan.degrees"))

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def config(self) -> str:
        """Algorithm and its options: 'usp dcp=2 dhp=2' (and a training trial's levers)."""
        words = [self.algorithm] + [f"{k}={v}" for k, v in self.options]
        if self.training is not None:
            words.append(self.training.label(self.world))
        if self.lengths is not None:  # a step of sequences: its policy tells the trials apart
            words.append(("dynamic" + ("/equal-counts" if self.equal_counts else "")
                          + ("/cost" if self.degrees == "cost" else ""))
                         if self.sp_policy == "dynamic" else f"static/{self.packing or 'best-fit'}")
        return " ".join(words)

    @property
    def mask(self) -> str:
        """The mask's compact form ('block_sparse:64:0.25:0'), or causal | full with its documents
        and window: 'causal docs=12 W=512'."""
        if self.mask_spec:
            return self.mask_spec
        out = "causal" if self.causal else "full"
        if self.documents is not None:
            out += f" docs={self.documents.short.split()[0]}"
        if self.window is not None:
            out += f" W={self.window}"
        return out

    @property
    def interval(self) -> tuple[float, float] | None:
        """The median step time's 95% confidence interval (ms), if logged."""
        m = self.metrics
        if "step_ms_ci_low" in m and "step_ms_ci_high" in m:
            return m["step_ms_ci_low"], m["step_ms_ci_high"]
        return None

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def oversubscribed(self) -> bool:
        """A CPU run with more ranks on one machine than it has cores: its times measure
        contention (the efficiency of world 4 on 2 cores is at most 0.5), not the algorithm."""
        if self.cores is None or (self.device or "cpu") != "cpu":
            return False
        world, nodes = max(1, self.world), max(1, _as_int(self.nodes))
        per_machine = world if self.topology != "real" else world // nodes
        return per_machine > self.cores


@dataclass(frozen=True)
class SweepView:
    """A sweep's parent run as the report needs it."""

    sweep_id: str
    name: str
    experiment: str            # the MLflow experiment's name
    start_time: int            # epoch ms
    tags: dict[str, str]       # the sweep's tags (environment, headline)
    store: str                 # the tracking URI
    params: dict[str, str] = field(default_factory=dict)  # sweep.source, sweep.preset, sweep.set.*

    @property
    def title(self) -> str:
        return f"sweep {self.name} ({self.sweep_id})"

    @property
    def headline(self) -> str:
        """The metric the sweep ranks by."""
        return self.tags.get("seqpar.headline") or "tokens_per_s"

    @property
    def command(self) -> str:
        """The command that ran it, as a user types it again: 'seqpar run sparse --preset
        gpu-cluster --set workload.seq_len=1024' or 'seqpar sweep examples/quickstart.yaml'."""
        source = self.params.get("sweep.source") or ""
        study = source.removeprefix("study:") if source.startswith("study:") else None
        study = study or (None if source else self.tags.get("seqpar.study") or None)
        if study is not None:
            preset = self.params.get("sweep.preset", "cpu")
            words = ["seqpar", "run", study, *(["--preset", preset] if preset != "cpu" else [])]
        else:
            words = ["seqpar", "sweep", source or "FILE"]
        sets = sorted((k.removeprefix("sweep.set."), v) for k, v in self.params.items()
                      if k.startswith("sweep.set."))
        return shlex.join(words + [w for k, v in sets for w in ("--set", f"{k}={v}")])

    @classmethod
    def read(cls, tracker: Tracker, sweep_id: str, field: str = "sweep") -> SweepView:
        """An old sweep, read back from the store (`field`: the option that named it)."""
        record = tracker.sweep(sweep_id, field)
        return cls(sweep_id, record.name, tracker.experiment_name(record), record.start_time,
                   dict(record.tags), tracker.uri, dict(record.params))


def trials(runs: Iterable[RunRecord]) -> list[TrialView]:
    return [TrialView.of(r) for r in runs]


BY_RANK = ("rank_step_ms", "rank_flops")  # a trial's per-rank medians, as metrics by rank


def per_rank_details(tracker: Tracker, runs: list[TrialView]) -> dict[str, dict[str, Any]]:
    """run id -> per_rank.json of each finished multi-rank trial (downloaded from the store); where
    the artifact is missing (a full artifact store when the trial ran) what the report needs of it,
    each rank's median step and FLOPs, from the run's own metrics (`"source": "metrics"`)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in runs:
            if not t.finished or t.world < 2:
                continue
            try:
                path = tracker.download(t.run_id, "per_rank.json", Path(tmp) / t.run_id)
                out[t.run_id] = json.loads(path.read_text())
            except Exception:  # missing, cut short or unreachable: the run's own medians
                detail = _from_metrics(tracker, t)
                if detail is not None:
                    out[t.run_id] = detail
    return out


def _from_metrics(tracker: Tracker, t: TrialView) -> dict[str, Any] | None:
    if BY_RANK[0] not in t.metrics:  # a run from before the medians were logged
        return None
    try:
        steps, flops = (tracker.metric_history(t.run_id, key) for key in BY_RANK)
    except Exception:
        return None
    if len(steps) != len(flops) or len(steps) < 2:
        return None
    return {"source": "metrics",
            "per_rank": [{"step_ms": [s], "flops": {"attention": f}}
                         for s, f in zip(steps, flops, strict=True)]}


def without_details(runs: list[TrialView], details: dict[str, dict[str, Any]]
                    ) -> tuple[list[str], list[str]]:
    """The finished multi-rank trials whose per-rank breakdown comes from their metrics (the
    per_rank.json artifact is missing), and those that have none at all, by name."""
    multi = [t for t in runs if t.finished and t.world >= 2]
    from_metrics = [t.name for t in multi if details.get(t.run_id, {}).get("source") == "metrics"]
    return from_metrics, [t.name for t in multi if t.run_id not in details]
