"""Where results go and how to look at them: the MLflow store's address (`--tracking-uri`, else
`MLFLOW_TRACKING_URI`, else an embedded SQLite store `sqlite:///<working directory>/mlflow.db`
with artifacts in `<working directory>/mlartifacts`), checked before any actor starts
(`check_uri`), a new SQLite store's lock, and the UI's compare-runs link (`compare_url`).

MLflow 3 refuses the old ./mlruns file store by default, and SQLite needs no server
(`mlflow ui --backend-store-uri sqlite:///mlflow.db` in that directory shows it). A SQLite store is
created under a file lock (`<db>.lock`): two sweeps started together in a fresh directory would
otherwise both run MLflow's schema migrations and one would die on `duplicate column name`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

from seqpar.errors import ConfigError

UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store by default
SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
SCHEME_RULE = ("unsupported scheme; MLflow takes sqlite:///PATH, http(s)://SERVER, "
               "postgresql://, mysql://, mssql:// or databricks")


def default_uri(workdir: str | Path | None = None) -> str:
    return f"sqlite:///{Path(workdir or os.getcwd()).resolve() / 'mlflow.db'}"


def resolve_uri(uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri()


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on `<db>.lock` beside a SQLite store (nothing for other stores)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mlflow_command() -> str:
    """The `mlflow` beside the Python running seqpar, as a user types it from here: `.venv/bin/
    mlflow` in the checkout (what the README types), the full path elsewhere; `mlflow` when
    there is none (then it is on the PATH, or not installed with seqpar)."""
    exe = Path(sys.executable).parent / "mlflow"
    if not exe.is_file():
        return "mlflow"
    try:
        here = exe.relative_to(Path.cwd())
    except ValueError:
        return str(exe)
    return str(here) if here.parent != Path(".") else f"./{here}"  # a path, not a PATH lookup


def compare_url(ui: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """MLflow's compare-runs view of these runs at the UI `ui`: parameters and every metric side
    by side, parallel coordinates and scatter plots (the runs table shows no metric column until
    one is chosen). The route is the UI's own (`#/compare-runs?runs=[..]&experiments=[..]`, JSON
    lists, percent-encoded: the page decodes them)."""
    def listed(ids: Sequence[str]) -> str:
        return urllib.parse.quote(json.dumps(list(ids), separators=(",", ":")), safe="")

    experiments = sorted(set(experiment_ids))
    return f"{ui.rstrip('/')}/#/compare-runs?runs={listed(run_ids)}&experiments={listed(experiments)}"


def check_uri(uri: str | None = None) -> str:
    """The tracking URI, refused in one line when its scheme is not a store MLflow opens: a check
    that writes nothing, for before any actor starts (the store itself is opened later)."""
    resolved = resolve_uri(uri)
    scheme = resolved.split(":", 1)[0].split("+", 1)[0] if ":" in resolved else ""
    if scheme not in SCHEMES:
        raise ConfigError("tracking-uri", resolved, SCHEME_RULE)
    return resolved


