"""The run reconciler at sizes a real cluster meets: the operator's shard size
pinned into the snapshot, Job deadlines that say what they are made of, a snapshot too large
for a ConfigMap, and status and event messages that stay bounded with 10,000 failed units.

Same harness as ``test_run_reconciler``: a fake kube client, a real SQLite store.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from evalkube import limits
from evalkube.controller import names
from evalkube.controller.run_decisions import JobState
from evalkube.engine.snapshot import parse_snapshot
from evalkube.models.snapshot import RunSnapshot

from .fake_kube import LiveJobIndex
from .test_run_reconciler import NS, ROWS, UNITS, Harness, run, suite


def _without_shard_size() -> dict[str, Any]:
    manifest = run()
    del manifest["spec"]["shardSize"]
    return manifest


def _snapshot(harness: Harness) -> RunSnapshot:
    config_map = harness.kube.objects[("ConfigMap", NS, names.snapshot_name("nightly"))]
    return RunSnapshot.model_validate_json(config_map["data"]["snapshot.json"])


def test_a_run_without_shard_size_takes_the_operators_pinned_into_its_snapshot(
    tmp_path: Path,
) -> None:
    """EVALKUBE_SHARD_SIZE applies when the EvalRun sets no shardSize; it is written into the
    snapshot, so the runner's plan (parsed from the snapshot, as a pod does) is the operator's,
    and an operator restarted with another setting plans the same units."""
    harness = Harness(tmp_path, parallelism=100, shard_size=4)
    harness.apply(suite())
    harness.apply(_without_shard_size())
    harness.step()
    expected = [f"qa.precomputed.{shard:05d}" for shard in range(7)]  # 25 rows by 4
    assert sorted(harness.jobs()) == expected
    snapshot = _snapshot(harness)
    assert snapshot.run_spec.shard_size == 4
    pod_plan = parse_snapshot(snapshot).units()
    assert [u.unit_id for u in pod_plan] == expected
    assert [(u.start, u.stop) for u in pod_plan][-1] == (24, 25)

    restarted = Harness(tmp_path, parallelism=100, shard_size=10)
    restarted.kube = harness.kube
    restarted.reconciler.kube = harness.kube  # type: ignore[assignment]
    setup = restarted.reconciler
    status = restarted.step()
    assert status is None or status["units"]["total"] == 7
    assert [u.unit_id for u in setup._setups["uid-1"].units] == expected


def test_a_runs_own_shard_size_wins_over_the_operators(tmp_path: Path) -> None:
    harness = Harness(tmp_path, parallelism=100, shard_size=4)
    harness.apply(suite())
    harness.apply(run())  # shardSize: 10
    harness.step()
    assert sorted(harness.jobs()) == UNITS
    assert _snapshot(harness).run_spec.shard_size == 10


def test_a_capped_job_deadline_is_warned_about_and_explains_a_deadline_failure(
    tmp_path: Path,
) -> None:
    """A shard whose worst case (10 rows x 120 s + 300 s) is longer than the cap gets the
    cap as its deadline, a DeadlineCapped warning naming shardSize and timeoutSeconds (once
    per task), and a unit that runs out of it fails with a reason saying what to change."""
    harness = Harness(tmp_path, unit_deadline_max_seconds=900)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    deadlines = {u: j["spec"]["activeDeadlineSeconds"] for u, j in harness.jobs().items()}
    assert deadlines == {UNITS[0]: 900, UNITS[1]: 900}
    capped = [e for e in harness.events if e[1] == "DeadlineCapped"]
    assert len(capped) == 1, harness.events
    kind, _, message = capped[0]
    assert kind == "Warning"
    assert "1500 s" in message, message
    assert "10 rows x 120 s" in message, message
    assert "spec.shardSize of at most 5" in message, message
    assert "timeoutSeconds" in message

    harness.set_job_condition(
        UNITS[0], "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"
    )
    harness.finish_unit(UNITS[1])
    harness.step()
    harness.finish_unit(UNITS[2])
    harness.step()
    assert harness.status["phase"] == "Failed"
    why = harness.condition("Succeeded")["message"]
    assert f"unit {UNITS[0]}: DeadlineExceeded: Job was active longer" in why, why
    assert "EVALKUBE_UNIT_DEADLINE_MAX_SECONDS" in why
    assert "spec.shardSize of at most 5" in why


def test_a_deadline_under_the_cap_is_the_worst_case_and_not_warned(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    assert {j["spec"]["activeDeadlineSeconds"] for j in harness.jobs().values()} == {1500}
    assert not [e for e in harness.events if e[1] == "DeadlineCapped"]


def test_a_snapshot_larger_than_a_config_map_fails_the_run_with_what_to_do(
    tmp_path: Path,
) -> None:
    """Inline rows past a ConfigMap's 1 MiB: the run ends Failed (SnapshotTooLarge) at once,
    naming the size, the task whose rows take the room and what to do, instead of a pass that
    fails every minute with no status; nothing is created."""
    harness = Harness(tmp_path)
    big = suite()
    rows = [{**row, "padding": "x" * 60_000} for row in ROWS[:20]]
    big["spec"]["tasks"][0]["dataset"]["rows"] = rows
    harness.apply(big)
    harness.apply(run())
    harness.step()
    assert harness.status["phase"] == "Failed"
    for kind in ("Ready", "Succeeded"):
        condition = harness.condition(kind)
        assert (condition["status"], condition["reason"]) == ("False", "SnapshotTooLarge")
    message = harness.condition("Succeeded")["message"]
    assert f"more than a ConfigMap holds ({limits.SNAPSHOT_CONFIGMAP_BYTES:,} bytes)" in message
    assert "task 'qa' inline dataset.rows" in message
    assert "dataset.configMapRef" in message
    assert ("ConfigMap", NS, names.snapshot_name("nightly")) not in harness.kube.objects
    assert harness.jobs() == {}
    assert ("Warning", "SnapshotTooLarge") in [e[:2] for e in harness.events]
    assert harness.step() is None  # a failed run is left alone


def test_ten_thousand_failed_units_leave_a_bounded_status_and_events(tmp_path: Path) -> None:
    """10,000 units failing at once: the conditions say how many failed, name the first ones
    with their reasons and how many more there are, within the status cap; every Event within
    the event cap; the whole status a few kilobytes."""
    harness = Harness(tmp_path)
    many = suite()
    many["spec"]["tasks"][0]["dataset"]["rows"] = [
        {"q": f"{i}?", "a": str(i), "out": str(i)} for i in range(10_000)
    ]
    harness.apply(many)
    harness.apply(run(shardSize=1))
    reason = "BackoffLimitExceeded: Job has reached the specified backoff limit " + "x" * 500
    failed = [(f"qa.precomputed.{n:05d}", JobState("failed", reason)) for n in range(10_000)]
    harness.step(index={(NS, "nightly"): failed})
    status = harness.status
    assert status["phase"] == "Failed"
    assert status["units"]["failed"] == 10_000
    assert len(json.dumps(status)) < 12_000
    message = harness.condition("Succeeded")["message"]
    assert len(message) <= limits.STATUS_MESSAGE_CHARS
    assert message.startswith("10000 of 10000 units failed: unit qa.precomputed.00000: Backoff")
    assert "more characters]" in message  # each reason cut on its own
    listed = message.count("unit qa.precomputed.")
    assert listed >= 5
    assert message.endswith(
        f"; and {10_000 - listed} more (their Jobs: kubectl get jobs -l evalkube.io/run=nightly)"
    ), message[-200:]
    assert all(len(e[2]) <= limits.EVENT_MESSAGE_CHARS for e in harness.events)
    [run_failed] = [e[2] for e in harness.events if e[1] == "RunFailed"]
    assert run_failed.startswith("10000 of 10000 units failed: unit qa.precomputed.00000")
    assert "more (their Jobs" in run_failed


def test_each_unit_is_aggregated_once_when_done_and_the_finish_merges_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass a unit's done report wakes keeps that unit's aggregate; finishing merges the
    kept aggregates (no read of every sample: no fallback logged) into the exact results."""
    harness = Harness(tmp_path)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    harness.finish_unit(UNITS[0], 1.0)
    harness.step()
    assert harness.store.unit_aggregate_ids(harness.run_id()) == {UNITS[0]}
    harness.finish_unit(UNITS[1], 0.5)
    harness.finish_unit(UNITS[2], 1.0)
    with caplog.at_level(logging.WARNING, logger="evalkube.controller.results"):
        harness.step()
    assert not caplog.records, caplog.text
    assert harness.store.unit_aggregate_ids(harness.run_id()) == set(UNITS)
    [result] = harness.status["results"]
    assert result["metrics"] == {"exact_match": 0.8}  # (10 + 5 + 5) / 25, exactly
    assert result["counts"] == {"samples": 25, "valid": 25, "invalid": 0, "errored": 0}


def test_a_unit_its_runner_reports_failed_fails_with_the_runners_reason(
    tmp_path: Path,
) -> None:
    """A runner that finds its unit cannot run (a grade_batch past its limits, programs that
    do not load) reports why; the unit fails with that reason even while its Job is still
    finishing, and a unit done afterwards is done (the report never overrides it)."""
    harness = Harness(tmp_path)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    reason = "task 'qa', model 'precomputed': grade_batch gets every sample ... split the task"
    harness.store.mark_unit_failed(harness.run_id(), UNITS[0], reason)
    harness.finish_unit(UNITS[1])
    harness.store.mark_unit_failed(harness.run_id(), UNITS[1], "too late: it is done")
    harness.step()
    harness.finish_unit(UNITS[2])
    harness.step()
    assert harness.status["phase"] == "Failed"
    assert harness.status["units"]["failed"] == 1
    message = harness.condition("Succeeded")["message"]
    assert message == f"1 of 3 units failed: unit {UNITS[0]}: {reason}"


def _planted_snapshot(tmp: Path, image: str) -> dict[str, Any]:
    """A snapshot ConfigMap of the run's name, made by a tenant: the suite's grader in an
    image the cluster does not admit."""
    (tmp / "honest").mkdir()
    honest = Harness(tmp / "honest")
    honest.apply(suite())
    honest.apply(run())
    honest.step()
    planted = copy.deepcopy(honest.kube.objects[("ConfigMap", NS, names.snapshot_name("nightly"))])
    snapshot = json.loads(planted["data"]["snapshot.json"])
    snapshot["suite"]["spec"]["tasks"][0]["grader"]["environment"] = image
    planted["data"]["snapshot.json"] = json.dumps(snapshot)
    return planted


def _assert_refused(harness: Harness, reason_text: str) -> None:
    assert harness.status["phase"] == "Failed"
    condition = harness.condition("Succeeded")
    assert condition["reason"] == "SnapshotNotOurs"
    assert reason_text in condition["message"], condition["message"]
    assert harness.jobs() == {}


def test_a_snapshot_config_map_made_before_the_run_is_never_run(tmp_path: Path) -> None:
    """Tenants create ConfigMaps, and the snapshot's name is predictable: one planted before
    the EvalRun exists would pick its graders and images past every check of the suite."""
    (tmp_path / "run").mkdir()
    harness = Harness(tmp_path / "run")
    harness.apply(suite())
    harness.apply(_planted_snapshot(tmp_path, "docker.io/attacker/python:3"))
    harness.apply(run())
    harness.step()
    _assert_refused(harness, "existed before the operator made this run's snapshot")


def test_a_snapshot_replaced_mid_run_is_refused_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    harness = Harness(tmp_path / "run")
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    assert harness.status["snapshotSha256"]
    planted = _planted_snapshot(tmp_path, "docker.io/attacker/python:3")
    restarted = Harness(tmp_path / "run")  # an operator that has not cached the run's setup
    restarted.kube = harness.kube
    restarted.reconciler.kube = harness.kube  # type: ignore[assignment]
    restarted.reconciler.jobs = LiveJobIndex(harness.kube)  # type: ignore[arg-type]
    for job in harness.kube.of_kind("Job"):
        del harness.kube.objects[("Job", NS, job["metadata"]["name"])]
    harness.kube.put(planted)  # the immutable ConfigMap deleted and made again
    restarted.step()
    _assert_refused(restarted, "differs from status.snapshotSha256")


def test_a_run_an_older_operator_started_keeps_its_snapshot(tmp_path: Path) -> None:
    """No digest recorded (an operator before this check): a run with a phase whose snapshot
    names its uid goes on."""
    harness = Harness(tmp_path)
    harness.apply(suite())
    harness.apply(run())
    harness.step()
    del harness.body["status"]["snapshotSha256"]
    restarted = Harness(tmp_path)
    restarted.kube = harness.kube
    restarted.reconciler.kube = harness.kube  # type: ignore[assignment]
    restarted.reconciler.jobs = LiveJobIndex(harness.kube)  # type: ignore[arg-type]
    restarted.step()
    assert restarted.status["phase"] == "Running"
