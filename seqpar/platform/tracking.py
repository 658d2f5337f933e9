"""MLflow: one experiment per study, a parent run per sweep, a child run per trial.

Where results go: `--tracking-uri`, else `MLFLOW_TRACKING_URI`, else an embedded SQLite store
`sqlite:///<working directory>/mlflow.db` with artifacts in `<working directory>/mlartifacts`
(`mlflow ui --backend-store-uri sqlite:///mlflow.db` in that directory shows them). MLflow 3
refuses the old ./mlruns file store by default, and SQLite needs no server.

This module knows runs, params, metrics and tags; it never sees an experiment spec (the platform
does not import experiments or sweeps), so callers hand it flat dicts.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError

PARENT_TAG = "mlflow.parentRunId"
HASH_TAG = "seqpar.spec_hash"
KIND_TAG = "seqpar.kind"  # "sweep" | "trial"


def default_uri(workdir: str | Path | None = None) -> str:
    return f"sqlite:///{Path(workdir or os.getcwd()).resolve() / 'mlflow.db'}"


def resolve_uri(uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri()


@lru_cache(maxsize=1)
def environment_tags() -> dict[str, str]:
    """seqpar's git commit (with '-dirty' when the tree has edits), versions and host."""
    here = Path(__file__).resolve().parents[2]
    commit = "unknown"
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += "-dirty" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "absent"

    return {"seqpar.git_commit": commit, "seqpar.torch_version": version("torch"),
            "seqpar.ray_version": version("ray"), "seqpar.mlflow_version": version("mlflow"),
            "seqpar.host": socket.gethostname()}


@dataclass
class RunRecord:
    run_id: str
    name: str
    status: str
    start_time: int
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def _record(run: Any) -> RunRecord:
    return RunRecord(run.info.run_id, run.info.run_name, run.info.status, run.info.start_time,
                     dict(run.data.params), dict(run.data.metrics), dict(run.data.tags))


class Tracker:
    """A thin, typed layer over MlflowClient for sweeps and trials."""

    def __init__(self, uri: str | None = None):
        from mlflow import MlflowClient

        # schema migrations of a new store are not news (mlflow configures its loggers on import)
        for name in ("alembic", "mlflow", "mlflow.store.db.utils"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.uri = resolve_uri(uri)
        self.client = MlflowClient(tracking_uri=self.uri)

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
            return exp.experiment_id
        if not create:
            return None
        root = self.local_artifact_root
        location = (root / name).as_uri() if root is not None else None
        return self.client.create_experiment(name, artifact_location=location)

    def start_sweep(self, experiment: str, name: str, params: dict[str, Any],
                    tags: dict[str, str]) -> str:
        """A parent run for a sweep; its run id is the sweep id."""
        exp_id = self.experiment_id(experiment)
        run = self.client.create_run(exp_id, run_name=name,
                                     tags={**environment_tags(), **tags, KIND_TAG: "sweep"})
        self._log(run.info.run_id, params=params)
        return run.info.run_id

    def sweep(self, sweep_id: str) -> RunRecord:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(sweep_id)
        except MlflowException:
            raise ConfigError("resume", sweep_id, f"no sweep with this id in {self.uri}") from None
        if run.data.tags.get(KIND_TAG) != "sweep":
            raise ConfigError("resume", sweep_id, "is a trial run, not a sweep (use the parent id)")
        return _record(run)

    def reopen_sweep(self, sweep_id: str) -> None:
        self.client.update_run(sweep_id, status="RUNNING")

    def end_sweep(self, sweep_id: str, status: str = "FINISHED", **tags: str) -> None:
        for key, value in tags.items():
            self.client.set_tag(sweep_id, f"seqpar.{key}", value)
        self.client.set_terminated(sweep_id, status=status)

    # ---------------------------------------------------------------------------- trials
    def log_trial(self, sweep_id: str, *, name: str, spec_hash: str, params: dict[str, Any],
                  metrics: dict[str, float], tags: dict[str, str], status: str,
                  cause: str | None, detail: dict[str, Any]) -> str:
        """One finished (or failed) trial as a child run, logged in one go."""
        parent = self.client.get_run(sweep_id)
        run_tags = {**environment_tags(), **tags, PARENT_TAG: sweep_id, HASH_TAG: spec_hash,
                    KIND_TAG: "trial"}
        if cause:
            run_tags["seqpar.cause"] = cause[:4000]  # a traceback's last lines; tags hold 8000
        run = self.client.create_run(parent.info.experiment_id, run_name=name, tags=run_tags)
        run_id = run.info.run_id
        self._log(run_id, params=params, metrics=metrics)
        self.client.log_dict(run_id, detail, "per_rank.json")
        self.client.set_terminated(run_id, status=status)
        return run_id

    def trials(self, sweep_id: str) -> list[RunRecord]:
        parent = self.client.get_run(sweep_id)
        return self._search([parent.info.experiment_id],
                            f"tags.`{PARENT_TAG}` = '{sweep_id}'")

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

    def log_figure(self, run_id: str, figure: Any, path: str) -> None:
        self.client.log_figure(run_id, figure, path)

    def log_dict(self, run_id: str, data: dict[str, Any], path: str) -> None:
        self.client.log_dict(run_id, data, path)

    def artifacts(self, run_id: str) -> list[str]:
        return [a.path for a in self.client.list_artifacts(run_id)]

    # ---------------------------------------------------------------------------- helpers
    def _search(self, exp_ids: list[str], filter_string: str,
                max_results: int = 5000) -> list[RunRecord]:
        runs = self.client.search_runs(exp_ids, filter_string, max_results=max_results,
                                       order_by=["attributes.start_time DESC"])
        return [_record(r) for r in runs]

    def _log(self, run_id: str, params: dict[str, Any] | None = None,
             metrics: dict[str, float] | None = None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        ps = [Param(k, str(v)) for k, v in (params or {}).items()]
        ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        for i in range(0, max(len(ps), len(ms)), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(run_id, metrics=ms[i:i + 100], params=ps[i:i + 100])
