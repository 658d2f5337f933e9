"""What users look at, loaded in headless Chromium: the MLflow experiment page, the chart view,
`seqpar report`'s HTML page and the Ray dashboard's actors page, all of the session's quickstart
sweep. Screenshots go to docs/."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.ui.browser import Page, run_chromium
from tests.ui.conftest import DOCS, PAGE_TIMEOUT_S, SCREENSHOTS

ML_VIEW = "workflowType=machine_learning"  # MLflow 3.17's runs view (its default is GenAI traces)


def text(dom: str) -> str:
    body = re.sub(r"<script.*?</script>|<style.*?</style>", "", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def shown(chromium: str, url: str, want: list[str], window: tuple[int, int] = (1400, 1000),
          screenshot: Path | None = None) -> str:
    """The page's text once every string in `want` is on it (or PAGE_TIMEOUT_S passed); with
    `screenshot`, a 1400 x 800 picture of it for docs/."""
    with Page(chromium, url, window=window) as page:
        page_text = page.wait_for(lambda t: all(w in t for w in want), PAGE_TIMEOUT_S)
        if screenshot is not None:
            page.resize(1400, 800)
            time.sleep(3)  # let it lay out again
            page.screenshot(screenshot)
    return re.sub(r"\s+", " ", page_text)


def test_mlflow_experiment_page_lists_every_trial(chromium, ui_sweep, mlflow_ui):
    url = f"{mlflow_ui}/#/experiments/{ui_sweep.experiment_id}?{ML_VIEW}"
    t0 = time.monotonic()
    page = shown(chromium, url, [*ui_sweep.trial_names, "quickstart"],
                 screenshot=DOCS / "mlflow-runs.png" if SCREENSHOTS else None)
    ui_sweep.timings["mlflow_runs_page_s"] = time.monotonic() - t0
    assert "Traces 0" not in page and "Runs" in page
    missing = [name for name in ui_sweep.trial_names if name not in page]
    assert not missing, f"trials not on the page: {missing}"
    assert "quickstart" in page  # the sweep's parent run, beside its trials


def test_mlflow_chart_view_shows_trials_and_the_headline(chromium, ui_sweep, mlflow_ui):
    url = (f"{mlflow_ui}/#/experiments/{ui_sweep.experiment_id}/runs?{ML_VIEW}"
           "&compareRunsMode=CHART")
    # charts are drawn lazily, as they scroll into view: a tall window holds them all
    t0 = time.monotonic()
    page = shown(chromium, url, [*ui_sweep.trial_names, "tokens_per_s"], window=(1400, 6000),
                 screenshot=DOCS / "mlflow-charts.png" if SCREENSHOTS else None)
    ui_sweep.timings["mlflow_chart_page_s"] = time.monotonic() - t0
    missing = [name for name in ui_sweep.trial_names if name not in page]
    assert not missing, f"trials not in the chart view: {missing}"
    assert "tokens_per_s" in page  # the headline metric: the parent's best and per algorithm
    assert "Model metrics (0)" not in page


def test_the_sweeps_compare_link_opens_mlflows_comparison_with_the_headline(
        chromium, ui_sweep, mlflow_ui, quickstart):
    """The link a finished sweep prints, on this store's server: MLflow's compare-runs view of
    every trial, parameters and metrics side by side, the headline metric among them (its metric
    list draws only the rows in view: the test scrolls it, as a reader does)."""
    found = re.search(r"compare in MLflow: \S+?(/#/compare-runs\?runs=\S+)", quickstart.stdout)
    assert found, quickstart.stdout[-3000:]
    t0 = time.monotonic()
    with Page(chromium, mlflow_ui + found.group(1), window=(1400, 3000)) as page:
        text = page.wait_for(lambda t: "Metrics" in t and ui_sweep.trial_names[0] in t,
                             PAGE_TIMEOUT_S)
        seen = [text]  # what the page showed while it was scrolled
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while "tokens_per_s" not in seen[-1] and time.monotonic() < deadline:
            page.scroll_boxes()
            time.sleep(0.5)
            seen.append(page.text())
    ui_sweep.timings["mlflow_compare_page_s"] = time.monotonic() - t0
    page_text = re.sub(r"\s+", " ", " ".join(seen))
    assert "Error while parsing URL" not in page_text
    assert "tokens_per_s" in page_text and "plan.algorithm" in page_text  # metrics, parameters
    assert f"Comparing {len(ui_sweep.trial_names)} Runs" in page_text
    missing = [name for name in ui_sweep.trial_names if name not in page_text]
    assert not missing, f"trials not compared: {missing}"


CHECK_IMAGES = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.dataset.images = imgs.map(i => i.complete && i.naturalWidth > 0 ? 1 : 0).join('');
});
</script></body>"""


def test_report_page_renders_tables_and_images(chromium, ui_sweep, tmp_path):
    from typer.testing import CliRunner

    from seqpar.cli.app import app

    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["--tracking-uri", ui_sweep.uri, "report", ui_sweep.sweep_id,
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert not re.search(r'(src|href)="(?!data:|#)', page), "the page must not load other files"
    probe = tmp_path / "probe.html"  # a copy that reports whether each image decoded
    probe.write_text(page.replace("</body>", CHECK_IMAGES))
    dom = run_chromium(chromium, probe.as_uri(), budget_ms=5000)
    flags = re.search(r'data-images="([01]*)"', dom)
    assert flags and flags.group(1) and set(flags.group(1)) == {"1"}, "an image did not render"
    assert len(flags.group(1)) >= 4  # throughput, memory, bytes by link, measured vs analytic, ...
    rows = re.search(r'<table id="comparison">.*?</table>', dom, flags=re.S)
    assert rows and all(name.split(" ")[0] in rows.group(0) for name in ui_sweep.trial_names)
    assert '<table id="environment">' in dom and "torch" in text(dom)
    if SCREENSHOTS:
        run_chromium(chromium, out.as_uri(), budget_ms=5000, screenshot=DOCS / "report.png",
                     window="1200,1400")


def test_ray_dashboard_shows_the_rank_actors_while_a_trial_runs(ui_sweep):
    assert not ui_sweep.dashboard_error, ui_sweep.dashboard_error
    assert ui_sweep.dashboard_url, "the quickstart's embedded Ray has no dashboard"
    assert ui_sweep.dashboard_seen_while_running, (
        f"never captured while the sweep ran: {ui_sweep.timings}; the page at "
        f"{ui_sweep.dashboard_address} showed: {ui_sweep.dashboard_text[:1500]!r}")
    names = set(re.findall(r"seqpar:sweep-[0-9a-f]{8}:rank-\d+", ui_sweep.dashboard_dom))
    assert {n.rsplit(":", 1)[1] for n in names} >= {"rank-0", "rank-1"}, names
    print("timings:", {k: round(v, 1) for k, v in ui_sweep.timings.items()})
