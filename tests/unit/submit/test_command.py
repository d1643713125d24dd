"""The pure parts of the command: its progress line from a run's status, the table in the
order ``evalkube run`` prints it; and ``--dry-run``, which needs no cluster and no store."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from evalkube.cli import app
from evalkube.engine.loading import load_files
from evalkube.models import TaskModelResult
from evalkube.submit.command import describe, in_suite_order
from evalkube.submit.plan import Store, build_plan
from tests.conftest import EXAMPLES

RECIPES = EXAMPLES / "recipes" / "suite.yaml"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({}, ("Pending", 0, 0)),
        (
            {
                "phase": "Pending",
                "conditions": [{"type": "Ready", "status": "False", "reason": "Preparing"}],
            },
            ("Pending · Preparing", 0, 0),
        ),
        (
            {
                "phase": "Running",
                "units": {"total": 9, "succeeded": 3, "running": 2, "pending": 3, "failed": 1},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Running"}],
            },
            ("Running · 2 running, 3 pending, 1 failed", 4, 9),
        ),
        (
            {
                "phase": "Running",
                "units": {"total": 4, "running": 4, "queued": 4},
                "conditions": [{"type": "Ready", "status": "False", "reason": "Queued"}],
            },
            ("Running · 4 running, 4 queued, Queued", 0, 4),
        ),
        ({"phase": "Succeeded", "units": {"total": 9, "succeeded": 9}}, ("Succeeded", 9, 9)),
    ],
)
def test_the_progress_line_of_a_status(
    status: dict[str, object], expected: tuple[str, int, int]
) -> None:
    assert describe(status) == expected


def test_results_print_in_the_suites_order_not_the_operators() -> None:
    loaded, run = load_files(RECIPES, None, versioned=False)
    store = Store.parse("s3://evals")
    plan = build_plan(loaded, run, namespace="ns", now=datetime.now(UTC), store=store)
    by_name = sorted(t.id for t in loaded.suite.spec.tasks)  # how status.results come
    results = [TaskModelResult(task=t, model="precomputed") for t in by_name]
    ordered = [r.task for r in in_suite_order(plan, results)]
    assert ordered == [t.id for t in loaded.suite.spec.tasks if t.id in by_name]


def test_dry_run_prints_the_manifests_and_reaches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # no cluster to ask
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.chdir(EXAMPLES.parent)
    result = CliRunner().invoke(
        app, ["submit", str(RECIPES), "--dry-run", "--store", "s3://evals/team", "-n", "qa"]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "EvalSuite", "EvalRun"]
    assert {d["metadata"]["namespace"] for d in docs} == {"qa"}
    grader = (EXAMPLES / "recipes" / "graders" / "exact_match.py").read_text()
    assert docs[0]["data"]["exact_match.py"] == grader  # a literal block, read back exactly
    data = EXAMPLES / "recipes" / "data" / "arithmetic.jsonl"
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    shown = "examples/recipes/data/arithmetic.jsonl"  # relative to the working directory
    assert f"would upload {shown} ({data.stat().st_size:,} bytes)" in result.stderr
    assert f"s3://evals/team/recipes/{digest}/arithmetic.jsonl" in result.stderr
    assert "at http://127.0.0.1:9" in result.stderr


def test_a_refusal_exits_2_before_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["submit", str(RECIPES), "--dry-run"])
    assert result.exit_code == 2
    assert "tasks[token_f1].outputs.path" in result.stderr
    assert "--store s3://BUCKET/PREFIX" in result.stderr
    without_dry_run = CliRunner().invoke(app, ["submit", str(RECIPES)])
    assert without_dry_run.exit_code == 2
    assert "cannot reach a cluster" in without_dry_run.stderr


def test_an_upload_to_aws_endpoint_url_for_a_run_that_reads_aws_is_warned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evalkube.models import EvalRunSpec
    from evalkube.submit.command import _endpoint_warnings

    loaded, run = load_files(RECIPES, None, versioned=False)
    plan = build_plan(
        loaded, run, namespace="ns", now=datetime.now(UTC), store=Store.parse("s3://evals")
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://seaweedfs.local:8333")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bare = EvalRunSpec.model_validate({"models": ["precomputed"]})
    (warning,) = _endpoint_warnings(plan, bare)
    assert "uploading to http://seaweedfs.local:8333 (AWS_ENDPOINT_URL)" in warning
    assert "its pods read AWS S3" in warning
    storage = {"s3": {"endpointURL": "http://seaweedfs.storage.svc:8333"}}
    named = EvalRunSpec.model_validate({"models": ["precomputed"], "storage": storage})
    assert _endpoint_warnings(plan, named) == []
