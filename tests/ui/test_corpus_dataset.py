"""A training trial on a corpus shows its dataset in MLflow's runs view: one real trial (the tiny
decoder, one rank, a Parquet corpus and a word-level tokenizer built here) swept on the shared
local Ray into the quickstart's store, shown by the MLflow server the other browser tests use (one
started here when this module runs alone)."""

from __future__ import annotations

import pytest

from tests import corpora
from tests.ui import browser as web
from tests.ui.conftest import MLFLOW_START_TIMEOUT_S
from tests.ui.test_browser import ML_VIEW, shown


@pytest.fixture(scope="module")
def mlflow_url(ui_sweep, quickstart):
    if quickstart.mlflow is not None:
        url, proc = quickstart.mlflow
        web.wait_http(url + "/health", MLFLOW_START_TIMEOUT_S, proc)
        yield url
        return
    url, proc = web.start_mlflow_server(ui_sweep.uri)
    try:
        web.wait_http(url + "/health", MLFLOW_START_TIMEOUT_S, proc)
        yield url
    finally:
        web.stop_process_group(proc)


@pytest.fixture(scope="module")
def corpus_sweep(ui_sweep, ray_runner, tmp_path_factory):
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
        tracker = Tracker(ui_sweep.uri)
        outcome = run_sweep(plan, tracker=tracker, runner=ray_runner, progress=False)
        run = tracker.client.get_run(outcome.trials[0].run_id)
        yield run, run.info.experiment_id
        for done in (*outcome.trials, outcome.sweep_id):  # the quickstart's store as it was
            tracker.client.delete_run(getattr(done, "run_id", done))
    finally:
        mp.undo()


def test_a_trial_on_a_corpus_shows_its_dataset_in_the_runs_view(chromium, mlflow_url,
                                                                corpus_sweep):
    run, experiment_id = corpus_sweep
    (logged,) = run.inputs.dataset_inputs
    assert logged.dataset.name == "my-shards" and '"documents": 5' in logged.dataset.profile
    url = f"{mlflow_url}/#/experiments/{experiment_id}?{ML_VIEW}"
    page = shown(chromium, url, [run.info.run_name, "my-shards"])
    assert "my-shards" in page, page[-2000:]
    assert logged.dataset.digest in page  # the runs table's Dataset column: name (digest)
