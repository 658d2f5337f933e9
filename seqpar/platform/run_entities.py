"""What seqpar writes into an MLflow run, as MLflow's entities: the tags every run carries
(`environment_tags`), its params and metrics (per-iteration series and per-rank values as steps)
in as few `log_batch` calls as MLflow's limits allow (`log_batches`: 100 params, 1,000 entities a
batch), a corpus as a dataset input (`dataset_input`); and MLflow's per-run artifact repository
(a queue and a thread pool each, cached for 1,024 runs), let go once a trial is written
(`forget_artifact_repo`). mlflow itself is imported where a run is written: a heavy optional
dependency, loaded lazily."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

PARAMS_PER_BATCH, ENTITIES_PER_BATCH = 100, 1000  # MLflow's log_batch limits


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
            "seqpar.host": socket.gethostname(), "seqpar.cpu_count": str(os.cpu_count() or 0)}


def log_batches(client: Any, run_id: str, params: Mapping[str, Any] | None = None,
                metrics: Mapping[str, float] | None = None,
                series: Mapping[str, Sequence[float]] | None = None,
                by_rank: Mapping[str, Sequence[float]] | None = None) -> None:
    """A run's params and metrics through `client` (an MlflowClient): metrics at step 0,
    `series` at steps 1..n, `by_rank` at steps 0..P-1 (the rank), in `batches`."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    ps = [Param(k, str(v)) for k, v in (params or {}).items()]
    ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
    ms += [Metric(k, float(v), now, step) for k, values in (series or {}).items()
           for step, v in enumerate(values, start=1)]
    ms += [Metric(k, float(v), now, rank) for k, values in (by_rank or {}).items()
           for rank, v in enumerate(values)]
    for batch_ps, batch_ms in batches(ps, ms):
        client.log_batch(run_id, metrics=batch_ms, params=batch_ps)


def batches(params: list[Any], metrics: list[Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """Params and metrics in as few `log_batch` calls as MLflow takes: at most 100 params and
    1,000 entities (params and metrics together) a call; one call for a typical trial."""
    p = m = 0
    while p < len(params) or m < len(metrics):
        take_p = params[p:p + PARAMS_PER_BATCH]
        take_m = metrics[m:m + ENTITIES_PER_BATCH - len(take_p)]
        yield take_p, take_m
        p, m = p + len(take_p), m + len(take_m)


def forget_artifact_repo(run_id: str) -> None:
    """Let MLflow drop the artifact repository it cached for a run once its artifacts are
    written: each holds a queue and a thread pool, kept for the last 1,024 runs (a long sweep's
    driver grew by them). MLflow makes a new one if the run is written again."""
    with contextlib.suppress(Exception):  # a private cache: a later MLflow may have none
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._artifact_repos_cache.pop(run_id, None)


def dataset_input(d: Mapping[str, Any], context: str = "training") -> Any:
    """One {name, digest, source, profile} as the DatasetInput mlflow.log_input makes of an
    mlflow.data dataset: a local source, the digest given (not recomputed), the profile as JSON."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    class _Profiled(MetaDataset):
        @property
        def profile(self) -> Any:
            return d.get("profile")

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": json.dumps(self.profile)}

    source = LocalArtifactDatasetSource(Path(str(d["source"])).resolve().as_uri())
    dataset = _Profiled(source, name=str(d["name"]), digest=str(d["digest"]))
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
