"""A training trial on a corpus shows its dataset in MLflow's runs view: one real trial (the tiny
decoder, one rank, a Parquet corpus and a word-level tokenizer built here) swept on the shared
local Ray into a store of its own. `make test` reads the dataset input back from the store; `make
test-full` also looks at it in Chromium, on an MLflow server of its own (9 CPU s to start). Apart
from the quickstart's store, so that the quickstart's tests and the embedded Ray's need not run on
one pytest-xdist worker (tests/parallel.py)."""

from __future__ import annotations

import shutil

import pytest

from tests import corpora
from tests.ui import browser as web
from tests.ui.conftest import MLFLOW_START_TIMEOUT_S
from tests.ui.test_browser import ML_VIEW, shown


@pytest.fixture(scope="module")
def corpus_store(empty_store_file, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus-store") / "mlflow.db"
    shutil.copyfile(empty_store_file, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def mlflow_server(chromium, corpus_store):
    """The MLflow server's URL and process, started now (it answers some seconds later)."""
    url, proc = web.start_mlflow_server(corpus_store)
    try:
        yield url, proc
    finally:
        web.stop_process_group(proc)


@pytest.fixture(scope="module")
def corpus_sweep(corpus_store, ray_runner, tmp_path_factory):
    from seqpar.platform.tracking import Tracker
    from seqpar.sweeps import spec
    from seqpar.sweeps.runner import run_sweep

    root = tmp_path_factory.mktemp("corpus-ui")
    mp = pytest.MonkeyPatch()
    mp.setenv("SEQPAR_CACHE_DIR", str(root / "cache"))
    try:
        tok = corpora.word_tokenizer(root / "tokenizer.json")
        shards = root / "my-shards"
        shards.mkdir()
        corpora.write(corpora.documents([40, 90, 12, 65, 30], 4), shards / "part-0.parquet",
                      "parquet")
        plan = spec.parse({
            "name": "corpus-ui",
            "base": {"model": {"heads": 4, "kv_heads": 2, "head_dim": 16},
                     "plan": {"algorithm": "local", "world": 1, "layout": "contiguous"},
                     "workload": {"seq_len": 64, "warmup": 0, "iters": 1,
                                  "data": {"corpus": str(shards), "tokenizer": str(tok)}},
                     "train": {"model": "tiny"}, "env": {"device": "cpu"}}})
        tracker = Tracker(corpus_store)
        outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
        run = tracker.client.get_run(outcome.trials[0].run_id)
        yield run, run.info.experiment_id
    finally:
        mp.undo()


def test_a_trial_on_a_corpus_logs_its_dataset_as_the_runs_view_reads_it(corpus_sweep):
    """`make test`'s part: the dataset input the runs view's Dataset column shows (name, digest)
    and its profile, read back from the store as the MLflow server reads it."""
    run, _ = corpus_sweep
    (logged,) = run.inputs.dataset_inputs
    assert logged.dataset.name == "my-shards" and '"documents": 5' in logged.dataset.profile
    assert logged.dataset.digest and logged.dataset.source_type


@pytest.mark.slow  # the same dataset input (above), drawn by MLflow's own page: make test-full
def test_a_trial_on_a_corpus_shows_its_dataset_in_the_runs_view(chromium, mlflow_server,
                                                                corpus_sweep):
    run, experiment_id = corpus_sweep
    mlflow_url, proc = mlflow_server
    web.wait_http(mlflow_url + "/health", MLFLOW_START_TIMEOUT_S, proc)
    (logged,) = run.inputs.dataset_inputs
    url = f"{mlflow_url}/#/experiments/{experiment_id}?{ML_VIEW}"
    page = shown(chromium, url, [run.info.run_name, "my-shards"])
    assert "my-shards" in page, page[-2000:]
    assert logged.dataset.digest in page  # the runs table's Dataset column: name (digest)
