"""A run whose dataset is a ``uri``: the operator creates the prepare Job and plans nothing
until its pod reports the pins; the pins then decide the plan, every unit's runner is told
its task, and a source that cannot be pinned fails the run naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller import names
from evalkube.engine.pod import prepare_sources
from evalkube.engine.snapshot import PREPARE_UNIT, Prepared, parse_snapshot
from evalkube.models.snapshot import RunSnapshot

from .test_run_reconciler import NS, Harness, run, suite

URI = "pvc://datasets/qa.jsonl"


def uri_suite() -> dict[str, Any]:
    """The reconciler tests' suite, its rows read from ``URI`` (no prompt: precomputed)."""
    doc = suite()
    [task] = doc["spec"]["tasks"]
    task["dataset"] = {"uri": URI, "idField": "id"}
    del task["prompt"]
    return doc


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    h = Harness(tmp_path, parallelism=10)
    h.apply(uri_suite())
    h.apply(run())
    return h


def play_prepare_pod(harness: Harness, claims: Path) -> dict[str, Any]:
    """What the prepare pod does: load the snapshot, pin every source, report."""
    data = harness.kube.objects[("ConfigMap", NS, names.snapshot_name("nightly"))]["data"]
    snapshot = parse_snapshot(RunSnapshot.model_validate_json(data["snapshot.json"]))
    snapshot.loaded.access.pvc_root = claims
    report = prepare_sources(snapshot)
    harness.store.mark_unit_done(harness.run_id(), PREPARE_UNIT, report)
    return report


def test_units_are_planned_from_the_pins_the_prepare_pod_reports(
    harness: Harness, tmp_path: Path
) -> None:
    harness.step()
    assert harness.status["phase"] == "Pending"
    assert harness.condition("Ready")["reason"] == "Preparing"
    assert "qa/dataset" in harness.condition("Ready")["message"]
    assert list(harness.jobs()) == [PREPARE_UNIT]  # no unit before the pins
    harness.step()
    assert list(harness.jobs()) == [PREPARE_UNIT]  # created once
    claims = tmp_path / "claims"
    (claims / "datasets").mkdir(parents=True)
    rows = [{"id": f"r{i}", "a": str(i), "out": str(i)} for i in range(25)]
    (claims / "datasets" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = play_prepare_pod(harness, claims)
    assert Prepared.from_wire(report).rows == {"qa": 25}
    harness.step()
    assert harness.status["phase"] == "Running"
    units = sorted(u for u in harness.jobs() if u != PREPARE_UNIT)
    assert units == ["qa.precomputed.00000", "qa.precomputed.00001", "qa.precomputed.00002"]
    runner = harness.jobs()[units[0]]["spec"]["template"]["spec"]["containers"][0]
    assert runner["command"][runner["command"].index("--task") + 1] == "qa"
    claim = [
        v
        for v in harness.jobs()[units[0]]["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claim[0]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    # the run's version names the bytes pinned, beyond the suite's
    assert (
        harness.status["suiteVersion"]
        != json.loads(
            harness.kube.objects[("ConfigMap", NS, names.snapshot_name("nightly"))]["data"][
                "snapshot.json"
            ]
        )["suite"]["version"]
    )
    assert any(e[1] == "SourcesPinned" and "25 rows" in e[2] for e in harness.events)


def test_a_source_that_cannot_be_pinned_fails_the_run_naming_it(
    harness: Harness, tmp_path: Path
) -> None:
    harness.step()
    (tmp_path / "claims" / "datasets").mkdir(parents=True)  # the file is missing
    report = play_prepare_pod(harness, tmp_path / "claims")
    assert "error" in report
    harness.step()
    assert harness.status["phase"] == "Failed"
    failed = harness.condition("Succeeded")
    assert failed["reason"] == "SourceUnavailable"
    assert "tasks[qa].dataset.uri" in failed["message"]
    assert "qa.jsonl" in failed["message"]
    assert list(harness.jobs()) == [PREPARE_UNIT]


def test_a_prepare_job_that_fails_without_reporting_fails_the_run(harness: Harness) -> None:
    harness.step()
    harness.set_job_condition(
        PREPARE_UNIT,
        "Failed",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    harness.step()
    assert harness.status["phase"] == "Failed"
    assert "prepare Job failed: BackoffLimitExceeded" in harness.condition("Succeeded")["message"]


def test_a_unit_whose_runner_gives_up_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    """The runner reports why it cannot run (``units/{unit}:failed``), and its Job fails at
    once (podFailurePolicy on the config-error exit code) instead of retrying."""
    from .test_run_reconciler import suite

    harness = Harness(tmp_path, parallelism=10)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    unit = "qa.precomputed.00001"
    job = harness.jobs()[unit]
    [rule, _] = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "runner", "operator": "In", "values": [2]},
    }
    reason = "tasks[qa].dataset.uri: s3://b/k changed since the run pinned it"
    harness.store.mark_unit_failed(harness.run_id(), unit, reason)
    for other in ("qa.precomputed.00000", "qa.precomputed.00002"):
        harness.finish_unit(other)
    harness.step()
    assert harness.status["phase"] == "Failed"
    message = harness.condition("Succeeded")["message"]
    assert f"unit {unit}: {reason}" in message
    # a unit reported done stays done whatever is reported later
    harness.store.mark_unit_failed(harness.run_id(), "qa.precomputed.00000", "late")
    assert "qa.precomputed.00000" in harness.store.done_units(harness.run_id())
    assert harness.store.failed_units(harness.run_id()) == {unit: reason}
