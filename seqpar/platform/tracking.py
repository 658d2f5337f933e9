"""MLflow: one experiment per study, a parent run per sweep, a child run per trial (`Tracker`).
Where the store is: `store`; what a run is written as: `run_entities`; its files: `artifacts`.

Layout in the MLflow UI: experiments are tagged as model-training experiments
(`mlflow.experimentKind`), so the UI opens on runs, not on GenAI traces. A sweep's parent run carries
the summary (headline metrics, the comparison table, the figures, the sweep file); its trials are
top-level runs linked to it by the tag `seqpar.sweep_id` (not nested under it: MLflow's runs table
and chart view hide nested runs until the parent is expanded), so every trial is in the chart view
and grouping by `seqpar.algorithm` works without clicks. Stores written before this layout (trials
nested with `mlflow.parentRunId`) are still read.

Artifacts never cost a measurement: a trial's params, metrics, tags and status are logged first
(its per-rank medians too, as metrics by rank: `rank_step_ms`, `rank_flops`, steps 0..P-1), its
artifacts after, and an artifact that cannot be written (a full or read-only volume, an artifact
server that refuses) is recorded in `Tracker.missing` instead of raised: the caller says so once and
lists them at the end. A failure to log the measurements themselves ends the run FAILED (never
RUNNING) before it propagates.

At scale a trial costs the store the same at trial 5,000 as at trial 5: one `create_run` (its tags),
its params and metrics in as few `log_batch` calls as MLflow's limits allow (100 params, 1,000
entities a batch), its status, its per_rank.json; the sweep's experiment is looked up once, not per
trial, and MLflow's per-run artifact repository (a queue and a thread pool each, cached for 1,024
runs) is let go once the trial's artifact is written. A sweep's trials come back with one paged
search on `seqpar.sweep_id` (`trials`: what `--resume` skips), whatever the sweep's size.

This module knows runs, params, metrics and tags; it never sees an experiment spec (the platform
does not import experiments or sweeps), so callers hand it flat dicts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError
from seqpar.platform.artifacts import Artifacts, MissingArtifact, first_line
from seqpar.platform.run_entities import (
    dataset_input,
    environment_tags,
    forget_artifact_repo,
    log_batches,
)
from seqpar.platform.store import SCHEME_RULE, UI_ADDRESS, mlflow_command, resolve_uri, store_lock

PARENT_TAG = "mlflow.parentRunId"  # how older stores linked a trial to its sweep
SWEEP_TAG = "seqpar.sweep_id"       # how a trial names its sweep's parent run
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"  # MLflow 3's UI: runs view, not the GenAI traces view
HASH_TAG = "seqpar.spec_hash"
KIND_TAG = "seqpar.kind"  # "sweep" | "trial"
LINK_TAG = "seqpar.trials_by"  # on a sweep whose trials all carry SWEEP_TAG (no older nesting)
PAGE = 5000  # runs a search reads a page (MLflow's SQL store allows up to 50,000)
PROGRESS_BARS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"  # MLflow's tqdm bars on every transfer


@dataclass
class RunRecord:
    """One MLflow run as seqpar reads it (or as it logged it: `Tracker.log_trial`)."""

    run_id: str
    name: str
    status: str
    start_time: int
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    experiment_id: str = ""  # MLflow's experiment id (the run's experiment)


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` for the block, where the user has not set it."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _record(run: Any) -> RunRecord:
    return RunRecord(run.info.run_id, run.info.run_name, run.info.status, run.info.start_time,
                     dict(run.data.params), dict(run.data.metrics), dict(run.data.tags),
                     run.info.experiment_id)


class Tracker(Artifacts):
    """A thin, typed layer over MlflowClient for sweeps and trials (its artifacts: `Artifacts`).

    `existing`: open only a store that is there, for the commands that read (`seqpar compare`,
    `seqpar report`): a SQLite file that does not exist is a ConfigError instead of a new store,
    and no lock file is made (the lock guards only a new store's schema)."""

    def __init__(self, uri: str | None = None, *, existing: bool = False):
        from mlflow import MlflowClient

        # schema migrations of a new store are not news (mlflow configures its loggers on import)
        for name in ("alembic", "mlflow", "mlflow.store.db.utils"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.uri = resolve_uri(uri)
        db = Path(self.uri.removeprefix("sqlite:///")) if self.uri.startswith("sqlite:///") else None
        if existing and db is not None and not db.is_file():
            raise ConfigError("tracking-uri", self.uri,
                              "holds no MLflow store (no such file): run `seqpar sweep` first")
        self.missing: list[MissingArtifact] = []  # artifacts that could not be written
        self._experiment_of: dict[str, str] = {}  # sweep id -> its experiment id (asked once)
        try:
            if existing:
                self.client = MlflowClient(tracking_uri=self.uri)
                return
            with store_lock(self.uri):  # a new SQLite store's schema is created once, here
                self.client = MlflowClient(tracking_uri=self.uri)
                if db is not None:
                    self.client.search_experiments(max_results=1)
        except Exception as err:  # an unknown scheme, an unreadable file: bad input, one line
            rule = first_line(err)
            if "unsupported URI" in rule:
                rule = SCHEME_RULE
            raise ConfigError("tracking-uri", self.uri, rule) from None

    @property
    def ui(self) -> str:
        """The MLflow UI of this store: the server itself, else where `mlflow ui` serves it."""
        return self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else UI_ADDRESS

    @property
    def ui_command(self) -> str | None:
        """How to serve this store's UI (None: a server already does)."""
        if self.uri.startswith(("http://", "https://")):
            return None
        return f"{mlflow_command()} ui --backend-store-uri {self.uri} --workers 1"

    @property
    def local_artifact_root(self) -> Path | None:
        """`<dir of mlflow.db>/mlartifacts` for a SQLite store; a server decides for itself."""
        if self.uri.startswith("sqlite:///"):
            return Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts"
        return None

    # ---------------------------------------------------------------- experiments and sweeps
    def experiment_id(self, name: str, create: bool = True) -> str | None:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if create and exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # a store from before
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
            return exp.experiment_id
        if not create:
            return None
        root = self.local_artifact_root
        location = (root / name).as_uri() if root is not None else None
        from mlflow.exceptions import MlflowException

        try:
            return self.client.create_experiment(name, artifact_location=location,
                                                 tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except MlflowException:  # a concurrent sweep created it first
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_sweep(self, experiment: str, name: str, params: dict[str, Any],
                    tags: dict[str, str]) -> str:
        """A parent run for a sweep; its run id is the sweep id."""
        exp_id = self.experiment_id(experiment)
        run = self.client.create_run(exp_id, run_name=name,
                                     tags={**environment_tags(), **tags, KIND_TAG: "sweep",
                                           LINK_TAG: SWEEP_TAG})
        self._log(run.info.run_id, params=params)
        self._experiment_of[run.info.run_id] = exp_id
        return run.info.run_id

    def _sweep_experiment(self, sweep_id: str) -> str:
        """The experiment id of a sweep's parent run, asked of the store once per sweep."""
        if sweep_id not in self._experiment_of:
            self._experiment_of[sweep_id] = self.client.get_run(sweep_id).info.experiment_id
        return self._experiment_of[sweep_id]

    def sweep(self, sweep_id: str, field: str = "resume") -> RunRecord:
        """The sweep's parent run; a ConfigError naming `field` (the option that gave the id) when
        the store holds no such sweep."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(sweep_id)
        except MlflowException:
            raise ConfigError(field, sweep_id, f"no sweep with this id in {self.uri}") from None
        if run.data.tags.get(KIND_TAG) != "sweep":
            raise ConfigError(field, sweep_id, "is a trial run, not a sweep (use the parent id)")
        return _record(run)

    def reopen_sweep(self, sweep_id: str) -> None:
        self.client.update_run(sweep_id, status="RUNNING")

    def end_sweep(self, sweep_id: str, status: str = "FINISHED", **tags: str) -> None:
        for key, value in tags.items():
            self.client.set_tag(sweep_id, f"seqpar.{key}", value)
        self.client.set_terminated(sweep_id, status=status)

    # ---------------------------------------------------------------------------- trials
    def log_trial(self, sweep_id: str, *, name: str, spec_hash: str, params: dict[str, Any],
                  metrics: Mapping[str, float], tags: dict[str, str], status: str,
                  cause: str | None, detail: dict[str, Any],
                  series: Mapping[str, Sequence[float]] | None = None,
                  by_rank: Mapping[str, Sequence[float]] | None = None,
                  start_time_ms: int | None = None) -> RunRecord:
        """One finished (or failed) trial as a run linked to its sweep; returns what was logged
        (the report reads it from memory, not back from the store). The measurements and the
        status first, then the artifact `detail` (per_rank.json), which may go missing (see the
        module docstring).

        `series` are per-iteration values (e.g. the step time of each timed iteration), logged with
        steps 1..n so MLflow draws them as curves; `by_rank` per-rank values, logged with steps
        0..P-1 (the rank); `start_time_ms` (epoch ms) makes the run's duration in the UI the
        trial's, not the logging's."""
        experiment_id = self._sweep_experiment(sweep_id)
        run_tags = {**environment_tags(), **tags, SWEEP_TAG: sweep_id, HASH_TAG: spec_hash,
                    KIND_TAG: "trial"}
        if cause:
            run_tags["seqpar.cause"] = cause[:4000]  # a traceback's last lines; tags hold 8000
        run = self.client.create_run(experiment_id, run_name=name, tags=run_tags,
                                     start_time=start_time_ms)
        run_id = run.info.run_id
        try:
            self._log(run_id, params=params, metrics=metrics, series=series, by_rank=by_rank)
        except BaseException:  # the store refused the measurements: the run must not stay RUNNING
            with contextlib.suppress(Exception):
                self.client.set_terminated(run_id, status="FAILED")
            raise
        self.client.set_terminated(run_id, status=status)
        self.log_dict(run_id, detail, "per_rank.json")
        forget_artifact_repo(run_id)
        latest = {k: float(v) for k, v in metrics.items() if v is not None}
        latest.update({k: float(v[-1]) for k, v in {**(series or {}), **(by_rank or {})}.items()
                       if len(v)})  # as the store reads it back: the value at the last step
        return RunRecord(run_id, name, status, run.info.start_time,
                         {k: str(v) for k, v in params.items()}, latest, run_tags, experiment_id)

    def delete_run(self, run_id: str) -> None:
        """Delete a run (a trial superseded by its rerun on resume)."""
        self.client.delete_run(run_id)

    def trials(self, sweep_id: str) -> list[RunRecord]:
        """Every trial run of a sweep, newest first: one paged search (a sweep from before its
        trials were linked by tag, one more for the nested ones)."""
        parent = self.client.get_run(sweep_id)
        exp = [parent.info.experiment_id]
        links = (SWEEP_TAG,) if parent.data.tags.get(LINK_TAG) == SWEEP_TAG else (
            SWEEP_TAG, PARENT_TAG)
        runs = {r.run_id: r for tag in links
                for r in self._search(exp, f"tags.`{tag}` = '{sweep_id}'")}
        return sorted(runs.values(), key=lambda r: -r.start_time)

    def finished_hashes(self, sweep_id: str) -> set[str]:
        """Spec hashes of this sweep's trials that FINISHED (resume skips them)."""
        return {r.tags[HASH_TAG] for r in self.trials(sweep_id)
                if r.status == "FINISHED" and HASH_TAG in r.tags}

    # ---------------------------------------------------------------------------- reading
    def study_trials(self, experiment: str) -> list[RunRecord]:
        exp_id = self.experiment_id(experiment, create=False)
        if exp_id is None:
            raise ConfigError("study", experiment, f"no runs in {self.uri}")
        return self._search([exp_id], f"tags.`{KIND_TAG}` = 'trial'")

    def latest_sweep(self) -> RunRecord | None:
        exps = [e.experiment_id for e in self.client.search_experiments()]
        if not exps:
            return None
        runs = self._search(exps, f"tags.`{KIND_TAG}` = 'sweep'", max_results=1)
        return runs[0] if runs else None

    def experiment_name(self, run: RunRecord) -> str:
        exp_id = self.client.get_run(run.run_id).info.experiment_id
        return self.client.get_experiment(exp_id).name

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        self._log(run_id, metrics=metrics)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def log_datasets(self, run_id: str, datasets: Sequence[Mapping[str, Any]],
                     context: str = "training") -> None:
        """The data a run read, as MLflow dataset inputs (the runs table's Dataset column, the
        compare view): each {name, digest, source, profile} (seqpar.corpus.cache.dataset_input),
        built with mlflow.data and logged as mlflow.log_input logs one."""
        if datasets:
            self.client.log_inputs(run_id, datasets=[dataset_input(d, context) for d in datasets])

    def artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(run_id, path)]

    def download(self, run_id: str, path: str, dst: str | Path) -> Path:
        """One artifact of a run, copied under `dst`; returns the local path. Without MLflow's
        progress bars (a report reads a dozen small files: three bars each on the terminal),
        unless MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR asks for them."""
        from mlflow.artifacts import download_artifacts

        with _env_default(PROGRESS_BARS, "false"):
            return Path(download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(dst),
                                           tracking_uri=self.uri))

    def metric_history(self, run_id: str, key: str) -> list[float]:
        return [m.value for m in sorted(self.client.get_metric_history(run_id, key),
                                        key=lambda m: m.step)]

    # ---------------------------------------------------------------------------- helpers
    def _search(self, exp_ids: list[str], filter_string: str,
                max_results: int | None = None) -> list[RunRecord]:
        """The runs matching `filter_string`, newest first: every page of them (at most
        `max_results`)."""
        out: list[RunRecord] = []
        token = None
        while max_results is None or len(out) < max_results:
            want = PAGE if max_results is None else min(PAGE, max_results - len(out))
            page = self.client.search_runs(exp_ids, filter_string, max_results=want,
                                           order_by=["attributes.start_time DESC"],
                                           page_token=token)
            out += [_record(r) for r in page]
            token = page.token
            if not token:
                break
        return out

    def _log(self, run_id: str, params: dict[str, Any] | None = None,
             metrics: Mapping[str, float] | None = None,
             series: Mapping[str, Sequence[float]] | None = None,
             by_rank: Mapping[str, Sequence[float]] | None = None) -> None:
        log_batches(self.client, run_id, params, metrics, series, by_rank)
