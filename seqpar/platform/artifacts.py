"""Writing a run's artifacts without ever losing the run: `Artifacts` is the part of
`tracking.Tracker` that writes files (per-rank JSON, figures, tables, the page, the sweep file).
A write that fails (a full or read-only volume, an artifact server that refuses) is recorded in
`missing` with where it was to go and the error, and the method returns False: the caller says so
once and lists what is missing at the end; the measurements, in the store, are untouched."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MissingArtifact:
    """An artifact that could not be written."""

    run_id: str
    path: str   # in the run (`per_rank.json`, `plots/scaling_vs_world.png`)
    where: str  # where it was to go (the run's artifact location and the path)
    error: str  # the error, one line


def first_line(err: BaseException) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


class Artifacts:
    """Artifact writers over `self.client` (an MlflowClient); failures go to `self.missing`."""

    client: Any
    missing: list[MissingArtifact]

    def _artifact(self, run_id: str, path: str, write: Callable[[], None]) -> bool:
        """Write one artifact; a failure is recorded in `missing` (and False returned), never
        raised: an artifact is never worth the measurements around it."""
        try:
            write()
            return True
        except Exception as err:
            try:
                where = f"{self.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{path}"
            except Exception:
                where = f"run {run_id}: {path}"
            self.missing.append(MissingArtifact(run_id, path, where.removeprefix("file://"),
                                                first_line(err)))
            return False

    def log_bytes(self, run_id: str, data: bytes, path: str) -> bool:
        """`data` as the artifact `path` (e.g. a figure's PNG, drawn once by the caller)."""
        directory, name = os.path.split(path)

        def write() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                local = Path(tmp) / name
                local.write_bytes(data)
                self.client.log_artifact(run_id, str(local), directory or None)

        return self._artifact(run_id, path, write)

    def log_dict(self, run_id: str, data: dict[str, Any], path: str) -> bool:
        return self._artifact(run_id, path, lambda: self.client.log_dict(run_id, data, path))

    def log_table(self, run_id: str, columns: list[str], rows: list[list[Any]], path: str) -> bool:
        """A table artifact the MLflow UI shows sortable (`MlflowClient.log_table`)."""
        data = {c: [None if row[i] is None else str(row[i]) for row in rows]
                for i, c in enumerate(columns)}
        return self._artifact(run_id, path,
                              lambda: self.client.log_table(run_id, data=data, artifact_file=path))

    def log_artifact(self, run_id: str, local_path: str | Path, directory: str | None = None
                     ) -> bool:
        path = f"{directory}/{Path(local_path).name}" if directory else Path(local_path).name
        return self._artifact(run_id, path,
                              lambda: self.client.log_artifact(run_id, str(local_path), directory))

    def log_text(self, run_id: str, text: str, path: str) -> bool:
        return self._artifact(run_id, path, lambda: self.client.log_text(run_id, text, path))

