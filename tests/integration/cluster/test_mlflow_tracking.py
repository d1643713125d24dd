"""The operator logs finished EvalRuns to a real MLflow tracking server (``mlflow server`` on
loopback, SQLite backend): params, metrics and artifacts read back through the MLflow client;
the runs of one EvalSchedule share an experiment; credentials come from Secrets the chart lets
the operator read (and only those); a tracking server that is down leaves the run Succeeded
with ``Tracked=False`` and the reason. The operator runs with the chart's RBAC, in-process as
`evalkube operator` runs it (with the HTML report renderer handed over)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.conftest import ROOT, require
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    _free_port,
    install_crds,
    play_to_the_end,
    run,
    running_operator,
    suite,
)
from tests.support.mlflow_server import MlflowServer

from evalkube.controller import tracking
from evalkube.controller.schedule_decisions import LABEL_SCHEDULE
from evalkube.reporting.report import render_report

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ALLOWED = "mlflow-token"
#: The picture docs/operator.md shows, taken by this test when EVALKUBE_UPDATE_DOCS_IMAGES=1.
SCREENSHOT = ROOT / "docs" / "images" / "mlflow-run.png"


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorUrl]:
    install_crds(control_plane)
    store = tmp_path_factory.mktemp("operator") / "results.db"
    tracking.use_report(render_report)  # as `evalkube operator` does
    try:
        with running_operator(
            control_plane,
            store,
            _free_port(),
            chart_values=[f"rbac.trackingSecrets[0]={ALLOWED}"],
            mlflow_attempts="2",
        ) as url:
            yield url
    finally:
        tracking.use_report(None)


def tracked(ns: str, name: str, mlflow: dict[str, Any], schedule: str | None = None) -> Any:
    manifest = run(ns, name)
    manifest["spec"]["shardSize"] = 100
    manifest["spec"]["tracking"] = {"mlflow": mlflow}
    if schedule:
        manifest["metadata"]["labels"] = {LABEL_SCHEDULE: schedule}
    return manifest


def tracked_condition(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    """The run's ``Tracked`` condition once it is no longer ``Unknown``."""

    def settled() -> dict[str, Any] | None:
        status = cp.kubectl_json("get", "evalrun", name, "-n", ns)["status"]
        found = next(c for c in status["conditions"] if c["type"] == "Tracked")
        return found if found["status"] != "Unknown" else None

    condition: dict[str, Any] = cp.wait_for(settled, timeout=240, what=f"{name} Tracked")
    return condition


def mlflow_client(server: MlflowServer) -> Any:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.url)


def test_a_finished_evalrun_is_an_mlflow_run_and_a_schedules_runs_share_an_experiment(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    cp.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ALLOWED, "namespace": ns},
              "stringData": {"token": "t0ken"}})  # fmt: skip
    target = {"trackingURI": mlflow_server.url, "tokenSecretRef": {"name": ALLOWED, "key": "token"}}
    statuses = {}
    for name in ("nightly-1", "nightly-2"):
        cp.apply(tracked(ns, name, target, schedule="nightly"))
        statuses[name] = play_to_the_end(cp, ns, name, operator, tmp_path)
        assert statuses[name]["phase"] == "Succeeded", statuses[name]
        assert tracked_condition(cp, ns, name)["status"] == "True"

    # the token's Secret is the operator's alone: no work-unit pod is given it
    jobs = cp.kubectl_json("get", "jobs", "-n", ns)["items"]
    assert jobs
    assert ALLOWED not in json.dumps(jobs)

    client = mlflow_client(mlflow_server)
    experiment = client.get_experiment_by_name(f"evalkube/{ns}/nightly")
    assert experiment is not None
    runs = {
        r.info.run_name: r
        for r in client.search_runs([experiment.experiment_id], order_by=["start_time"])
    }
    assert set(runs) == {"nightly-1", "nightly-2"}
    condition = tracked_condition(cp, ns, "nightly-2")
    assert condition["reason"] == "Logged"
    assert runs["nightly-2"].info.run_id in condition["message"]

    found, status = runs["nightly-1"], statuses["nightly-1"]
    assert found.info.status == "FINISHED"
    assert found.data.params["suite"] == "qa"
    assert found.data.params["suite_version"] == status["suiteVersion"]
    assert found.data.params["models"] == "precomputed"
    tags = found.data.tags
    assert (tags["evalkube.namespace"], tags["evalkube.evalrun"]) == (ns, "nightly-1")
    assert tags["evalkube.schedule"] == "nightly"
    assert tags["evalkube.phase"] == "Succeeded"
    expected: dict[str, float] = {}
    for result in status["results"]:
        where = f"{result['task']}/{result['model']}"
        expected.update({f"{where}/{m}": v for m, v in result["metrics"].items()})
        expected.update({f"{where}/count/{c}": v for c, v in result["counts"].items()})
    assert found.data.metrics == pytest.approx(expected)
    assert expected["qa/precomputed/exact_match"] == 0.8

    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert artifacts == {"report.html", "samples.jsonl", "results.json"}
    folder = Path(client.download_artifacts(found.info.run_id, "", str(tmp_path / "dl")))
    lines = (folder / "samples.jsonl").read_text().splitlines()
    assert len(lines) == sum(r["counts"]["samples"] for r in status["results"])
    assert {json.loads(line)["task_id"] for line in lines} == {"qa", "sentiment"}
    assert "exact_match" in (folder / "report.html").read_text()

    page = condition["message"].rsplit(": ", 1)[1]
    assert page.startswith(f"{mlflow_server.url}/#/experiments/{experiment.experiment_id}/runs/")
    shown = metric_on_page(page, "qa/precomputed/exact_match", tmp_path / "mlflow-run.png")
    assert shown == "0.8"


def metric_on_page(url: str, metric: str, screenshot: Path) -> str:
    """Open the MLflow UI's page of a run in headless Chromium (Debian's, `.ci/browser.sh`);
    the value its metrics table shows for ``metric``. Saves a screenshot of the table."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        require("Chromium and chromedriver are not installed (bash .ci/browser.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.get(url)
        cell = f"//*[@role='row'][.//*[normalize-space(text())='{metric}']]"
        deadline = time.monotonic() + 60
        while not (rows := driver.find_elements(By.XPATH, cell)):
            assert time.monotonic() < deadline, driver.find_element(By.TAG_NAME, "body").text
            time.sleep(0.5)
        row = rows[0]
        assert row.is_displayed()
        name, value = row.text.splitlines()
        assert name == metric
        for search in driver.find_elements(By.XPATH, "//input[contains(@placeholder, 'metrics')]"):
            search.send_keys(metric.split("/")[0])  # the task's metrics, for the picture
        for close in driver.find_elements(By.XPATH, "//button[@aria-label='Close']"):
            if close.is_displayed():
                close.click()  # the assistant panel beside the run
        heading = "//*[starts-with(normalize-space(text()), 'Metrics (')]"
        driver.execute_script(
            "arguments[0].scrollIntoView({block: 'start'})", driver.find_element(By.XPATH, heading)
        )
        time.sleep(1)
        driver.save_screenshot(str(screenshot))
        if os.environ.get("EVALKUBE_UPDATE_DOCS_IMAGES"):
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(screenshot, SCREENSHOT)
        return str(value)
    finally:
        driver.quit()


def test_tracking_failures_leave_the_run_succeeded_with_the_reason(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    """A Secret the chart does not name, and a tracking server that is down."""
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    cp.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other", "namespace": ns},
              "stringData": {"token": "t0ken"}})  # fmt: skip
    forbidden = {
        "trackingURI": mlflow_server.url,
        "tokenSecretRef": {"name": "other", "key": "token"},
    }
    down = {"trackingURI": f"http://127.0.0.1:{_free_port()}", "experiment": "nowhere"}
    for name, target in (("forbidden", forbidden), ("down", down)):
        cp.apply(tracked(ns, name, target))
        status = play_to_the_end(cp, ns, name, operator, tmp_path)
        assert status["phase"] == "Succeeded", status
    refused = tracked_condition(cp, ns, "forbidden")
    assert refused["status"] == "False"
    assert refused["reason"] == "TrackingFailed"
    assert f"Secret {ns}/other: the operator may not read it" in refused["message"]
    assert "rbac.trackingSecrets" in refused["message"]
    unreachable = tracked_condition(cp, ns, "down")
    assert unreachable["status"] == "False"
    assert (
        f"MLflow at {down['trackingURI']}: could not find the experiment after 2 attempts"
        in (unreachable["message"])
    )
    final = cp.kubectl_json("get", "evalrun", "down", "-n", ns)["status"]
    assert final["phase"] == "Succeeded"
    succeeded = next(c for c in final["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True"
