"""`evalkube run --mlflow` against a real MLflow tracking server (`mlflow server`, SQLite
backend, local artifacts, on loopback): the run is read back through the MLflow client with its
params, tags, metrics and artifacts; a stopped server leaves the run Succeeded with a warning,
and `evalkube track` logs it once the server is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

EVALKUBE = Path(sys.executable).parent / "evalkube"
SUITE = EXAMPLES / "recipes" / "suite.yaml"
GATE = {"thresholds": [{"metric": "exact_match", "min": 0.5}]}


def evalkube(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def run_file(tmp_path: Path, tracking: dict[str, Any] | None = None) -> Path:
    spec: dict[str, Any] = {
        "models": ["precomputed"],
        "generation": {"temperature": 0.2, "seed": 7},
        "gate": GATE,
    }
    if tracking:
        spec["tracking"] = tracking
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"kind": "EvalRun", "metadata": {"name": "r"}, "spec": spec}))
    return path


def client(server: MlflowServer) -> Any:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.url)


def mlflow_run(server: MlflowServer, experiment: str, run_id: str) -> Any:
    mlflow = client(server)
    found = mlflow.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = mlflow.search_runs(
        [found.experiment_id], filter_string=f"tags.`evalkube.run_id` = '{run_id}'"
    )
    assert len(runs) == 1, runs
    return runs[0]


def test_a_local_run_appears_as_an_mlflow_run(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = evalkube(
        "run", str(SUITE), str(run_file(tmp_path)), "--sandbox", "process", "-q",
        "--db", str(tmp_path / "r.db"), "-o", str(out),
        "--mlflow", mlflow_server.url, "--mlflow-experiment", "recipes-e2e",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    run_id = results["run_id"]
    assert f"mlflow: logged run {run_id} as MLflow run" in done.stderr
    assert "View run" not in done.stdout  # the client's own line stays out of the scores

    found = mlflow_run(mlflow_server, "recipes-e2e", run_id)
    assert found.info.status == "FINISHED"
    assert found.info.run_name == run_id
    params = found.data.params
    assert params["suite"] == "recipes"
    assert params["suite_version"] == results["suite_version"]
    assert params["models"] == "precomputed"
    assert params["generation.temperature"] == "0.2"
    assert params["generation.seed"] == "7"
    assert json.loads(params["gate"]) == GATE
    tags = found.data.tags
    assert tags["evalkube.phase"] == "Succeeded"
    assert tags["evalkube.gate"] == ("passed" if results["gate"]["passed"] else "failed")
    # every task x model x metric and count, exactly as --output holds them
    expected: dict[str, float] = {}
    for result in results["results"]:
        where = f"{result['task']}/{result['model']}"
        for metric, value in result["metrics"].items():
            expected[f"{where}/{metric}"] = value
        for count, value in result["counts"].items():
            expected[f"{where}/count/{count}"] = value
        for purpose, value in result["model_calls"].items():
            expected[f"{where}/model_calls/{purpose}"] = value
    expected["gate_passed"] = 1.0 if results["gate"]["passed"] else 0.0
    assert found.data.metrics == pytest.approx(expected)
    assert expected["exact_match/precomputed/exact_match"] == 0.6

    mlflow = client(mlflow_server)
    artifacts = {a.path for a in mlflow.list_artifacts(found.info.run_id)}
    assert artifacts == {"report.html", "samples.jsonl", "results.json"}
    folder = Path(mlflow.download_artifacts(found.info.run_id, "", str(tmp_path / "dl")))
    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == sum(r["counts"]["samples"] for r in results["results"])
    report = (folder / "report.html").read_text()
    assert run_id in report
    assert 'class="rid"' in report
    assert json.loads((folder / "results.json").read_text())[0]["task"] == "exact_match"


def test_the_run_files_tracking_and_the_variable(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """``EVALKUBE_MLFLOW_TRACKING_URI`` names the server, the run file's
    ``spec.tracking.mlflow.experiment`` the experiment; `evalkube track` logs the run again
    into the same MLflow run."""
    runs = run_file(
        tmp_path, {"mlflow": {"trackingURI": "http://unused.invalid", "experiment": "from-file"}}
    )
    db = str(tmp_path / "r.db")
    env = {"EVALKUBE_MLFLOW_TRACKING_URI": mlflow_server.url}
    out = tmp_path / "results.json"
    done = evalkube(
        "run", str(SUITE), str(runs), "--sandbox", "process", "-q", "--db", db, "-o", str(out),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = json.loads(out.read_text())["run_id"]
    first = mlflow_run(mlflow_server, "from-file", run_id)
    again = evalkube("track", run_id, "--db", db, env=env)
    assert again.returncode == 0, again.stderr
    assert mlflow_run(mlflow_server, "from-file", run_id).info.run_id == first.info.run_id


def test_a_stopped_server_leaves_the_run_succeeded_with_a_warning(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    stopped = MlflowServer(mlflow_server.bindir, tmp_path / "stopped").start()
    stopped.stop()
    db = str(tmp_path / "r.db")
    out = tmp_path / "results.json"
    done = evalkube(
        "run", str(SUITE), "--sandbox", "process", "-q", "--db", db, "-o", str(out),
        "--mlflow", stopped.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exact_match" in done.stdout  # the scores were printed
    run_id = json.loads(out.read_text())["run_id"]
    warning = " ".join(done.stderr.split())
    assert f"warning: MLflow at {stopped.url}: could not find the experiment after 4 " in warning
    assert f"log it later with `evalkube track {run_id} --mlflow {stopped.url}`" in warning
    listed = evalkube("runs", "--json", "--db", db)
    assert json.loads(listed.stdout)["runs"][0]["phase"] == "Succeeded"

    stopped.start()  # the same server back, on its port
    try:
        later = evalkube("track", run_id, "--db", db, "--mlflow", stopped.url)
        assert later.returncode == 0, later.stderr
        assert mlflow_run(stopped, "evalkube/recipes", run_id).info.status == "FINISHED"
    finally:
        stopped.stop()
