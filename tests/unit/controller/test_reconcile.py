"""``decide()``: the pure reconcile decisions and the documented failure policy, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from evalkube.controller.run_decisions import JobState, decide, job_state, summary_line
from evalkube.engine.plan import Unit, plan_units
from evalkube.models.status import condition, merge_conditions

ACTIVE = JobState("active")
SUCCEEDED = JobState("succeeded")


def failed(
    reason: str = "BackoffLimitExceeded: Job has reached the specified backoff limit",
) -> JobState:
    return JobState("failed", reason)


def units_of(*tasks: tuple[str, int, bool], models: tuple[str, ...] = ("m",)) -> list[Unit]:
    return plan_units(list(tasks), list(models), 10)


def ids(units: list[Unit]) -> list[str]:
    return [u.unit_id for u in units]


# -- creating Jobs ----------------------------------------------------------------------------
def test_first_pass_creates_up_to_the_parallelism_cap_in_plan_order() -> None:
    units = units_of(("qa", 50, False))
    decision = decide(units, {}, set(), parallelism=2)
    assert ids(decision.create) == ["qa.m.00000", "qa.m.00001"]
    assert decision.phase == "Running"
    assert decision.counts().to_wire() == {
        "total": 5,
        "succeeded": 0,
        "running": 0,
        "failed": 0,
        "pending": 5,
        "queued": 0,
    }


def test_running_jobs_count_against_the_cap() -> None:
    units = units_of(("qa", 50, False))
    jobs = {"qa.m.00000": ACTIVE, "qa.m.00001": ACTIVE}
    assert decide(units, jobs, set(), parallelism=2).create == []
    decision = decide(units, jobs, set(), parallelism=3)
    assert ids(decision.create) == ["qa.m.00002"]
    assert decision.active == 2


def test_done_units_free_their_slot() -> None:
    units = units_of(("qa", 50, False))
    jobs = {"qa.m.00000": SUCCEEDED, "qa.m.00001": ACTIVE}
    decision = decide(units, jobs, {"qa.m.00000"}, parallelism=2)
    assert ids(decision.create) == ["qa.m.00002"]
    assert (decision.done, decision.active) == (1, 1)


def test_a_done_unit_whose_job_is_still_active_counts_as_done() -> None:
    units = units_of(("qa", 10, False))
    decision = decide(units, {"qa.m.00000": ACTIVE}, {"qa.m.00000"}, parallelism=1)
    assert decision.phase == "Succeeded"
    assert decision.active == 0


def test_a_done_unit_whose_job_is_gone_is_not_recreated() -> None:
    """A Job deleted by ttlSecondsAfterFinished (or by hand) after its unit reported done."""
    units = units_of(("qa", 20, False))
    decision = decide(units, {}, {"qa.m.00000"}, parallelism=5)
    assert ids(decision.create) == ["qa.m.00001"]


def test_same_observations_ask_for_nothing_new() -> None:
    """Idempotent: after the Jobs asked for exist, the next pass creates nothing more."""
    units = units_of(("qa", 30, False), ("b", 5, True))
    first = decide(units, {}, set(), parallelism=10)
    jobs = {u.unit_id: ACTIVE for u in first.create}
    second = decide(units, jobs, set(), parallelism=10)
    assert second.create == []
    assert decide(units, jobs, set(), parallelism=10).counts() == second.counts()


def test_parallelism_zero_room_never_goes_negative() -> None:
    units = units_of(("qa", 30, False))
    jobs = {u.unit_id: ACTIVE for u in units}
    decision = decide(units, jobs, set(), parallelism=1)  # e.g. lowered after Jobs were made
    assert decision.create == []
    assert decision.counts().pending == 0


# -- aggregate units --------------------------------------------------------------------------
def test_aggregate_waits_for_every_shard_of_its_task_and_model() -> None:
    units = units_of(("s", 25, True))
    assert ids(units) == ["s.m.00000", "s.m.00001", "s.m.00002", "s.m.batch"]
    decision = decide(units, {}, set(), parallelism=10)
    assert ids(decision.create) == ["s.m.00000", "s.m.00001", "s.m.00002"]
    jobs = {"s.m.00000": SUCCEEDED, "s.m.00001": SUCCEEDED, "s.m.00002": ACTIVE}
    assert decide(units, jobs, {"s.m.00000", "s.m.00001"}, parallelism=10).create == []
    done = {"s.m.00000", "s.m.00001", "s.m.00002"}
    jobs["s.m.00002"] = SUCCEEDED
    assert ids(decide(units, jobs, done, parallelism=10).create) == ["s.m.batch"]


def test_aggregate_waits_for_shards_not_yet_created() -> None:
    units = units_of(("s", 30, True))
    jobs = {"s.m.00000": SUCCEEDED}
    decision = decide(units, jobs, {"s.m.00000"}, parallelism=1)
    assert ids(decision.create) == ["s.m.00001"]


def test_aggregates_are_per_task_and_model() -> None:
    units = units_of(("s", 5, True), models=("a", "b"))
    jobs = {"s.a.00000": SUCCEEDED, "s.b.00000": ACTIVE}
    decision = decide(units, jobs, {"s.a.00000"}, parallelism=10)
    assert ids(decision.create) == ["s.a.batch"]


def test_aggregate_of_a_failed_group_is_not_run() -> None:
    units = units_of(("s", 20, True), ("qa", 10, False))
    jobs = {"s.m.00000": failed(), "s.m.00001": SUCCEEDED, "qa.m.00000": SUCCEEDED}
    decision = decide(units, jobs, {"s.m.00001", "qa.m.00000"}, parallelism=10)
    assert decision.create == []
    assert decision.failed["s.m.batch"] == "not run: shard units of this task and model failed"
    assert decision.phase == "Failed"


def test_aggregate_is_marked_not_run_as_soon_as_one_shard_failed() -> None:
    units = units_of(("s", 20, True))
    jobs = {"s.m.00000": failed(), "s.m.00001": ACTIVE}
    decision = decide(units, jobs, set(), parallelism=10)
    assert decision.create == []
    assert set(decision.failed) == {"s.m.00000", "s.m.batch"}
    assert decision.phase == "Running"  # the other shard still runs


def test_a_failed_aggregate_job_fails_the_unit() -> None:
    units = units_of(("s", 5, True))
    jobs = {"s.m.00000": SUCCEEDED, "s.m.batch": failed("DeadlineExceeded: too slow")}
    decision = decide(units, jobs, {"s.m.00000"}, parallelism=10)
    assert decision.failed == {"s.m.batch": "DeadlineExceeded: too slow"}
    assert decision.phase == "Failed"


# -- failure policy ---------------------------------------------------------------------------
def test_a_failed_job_fails_its_unit_with_the_jobs_reason() -> None:
    units = units_of(("qa", 20, False))
    jobs = {"qa.m.00000": failed(), "qa.m.00001": ACTIVE}
    decision = decide(units, jobs, set(), parallelism=10)
    assert decision.failed == {
        "qa.m.00000": "BackoffLimitExceeded: Job has reached the specified backoff limit"
    }
    assert decision.phase == "Running"
    assert decision.counts().failed == 1


def test_a_failed_job_without_a_reason_still_explains() -> None:
    units = units_of(("qa", 5, False))
    decision = decide(units, {"qa.m.00000": JobState("failed")}, set(), parallelism=1)
    assert decision.failed == {"qa.m.00000": "the unit's Job failed"}


def test_a_succeeded_job_without_a_done_report_fails_its_unit() -> None:
    units = units_of(("qa", 10, False))
    decision = decide(units, {"qa.m.00000": SUCCEEDED}, set(), parallelism=1)
    assert decision.failed == {
        "qa.m.00000": "the unit's Job completed but its runner never reported the unit done"
    }
    assert decision.phase == "Failed"


def test_failed_units_are_not_recreated_and_do_not_hold_a_slot() -> None:
    units = units_of(("qa", 30, False))
    jobs = {"qa.m.00000": failed()}
    decision = decide(units, jobs, set(), parallelism=1)
    assert ids(decision.create) == ["qa.m.00001"]


def test_other_units_go_on_after_a_failure() -> None:
    units = units_of(("bad", 10, False), ("good", 20, False))
    decision = decide(units, {"bad.m.00000": failed()}, set(), parallelism=10)
    assert ids(decision.create) == ["good.m.00000", "good.m.00001"]


# -- phases -----------------------------------------------------------------------------------
def test_phase_succeeded_when_every_unit_is_done() -> None:
    units = units_of(("qa", 20, False), ("s", 5, True))
    done = {u.unit_id for u in units}
    decision = decide(units, dict.fromkeys(done, SUCCEEDED), done, parallelism=1)
    assert decision.phase == "Succeeded"
    assert decision.complete
    assert decision.create == []
    assert decision.counts().to_wire() == {
        "total": 4,
        "succeeded": 4,
        "running": 0,
        "failed": 0,
        "pending": 0,
        "queued": 0,
    }


def test_phase_failed_only_once_nothing_is_left_running() -> None:
    units = units_of(("qa", 30, False))
    jobs = {"qa.m.00000": failed(), "qa.m.00001": SUCCEEDED, "qa.m.00002": ACTIVE}
    running = decide(units, jobs, {"qa.m.00001"}, parallelism=10)
    assert running.phase == "Running"
    assert not running.complete
    jobs["qa.m.00002"] = SUCCEEDED
    over = decide(units, jobs, {"qa.m.00001", "qa.m.00002"}, parallelism=10)
    assert over.phase == "Failed"
    assert over.complete
    assert over.counts().to_wire() == {
        "total": 3,
        "succeeded": 2,
        "running": 0,
        "failed": 1,
        "pending": 0,
        "queued": 0,
    }


def test_phase_running_while_units_wait() -> None:
    units = units_of(("qa", 30, False))
    decision = decide(units, {"qa.m.00000": SUCCEEDED}, {"qa.m.00000"}, parallelism=1)
    assert decision.phase == "Running"
    assert ids(decision.create) == ["qa.m.00001"]
    assert decision.counts().pending == 2  # the one created now still counts as pending


# -- reading Jobs -----------------------------------------------------------------------------
def _job(*conditions: dict[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": list(conditions)}}


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({}, ACTIVE),
        ({"status": {}}, ACTIVE),
        ({"status": {"active": 1}}, ACTIVE),
        (_job({"type": "Complete", "status": "True"}), SUCCEEDED),
        (_job({"type": "Complete", "status": "False"}), ACTIVE),
        (
            _job({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}),
            JobState("failed", "BackoffLimitExceeded"),
        ),
        (
            _job(
                {"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"},
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                },
            ),
            JobState("failed", "DeadlineExceeded: Job was active longer than specified deadline"),
        ),
        (_job({"type": "Failed", "status": "True"}), JobState("failed", "")),
        (_job({"type": "SuccessCriteriaMet", "status": "True"}), ACTIVE),
    ],
)
def test_job_state_reads_the_jobs_conditions(job: dict[str, Any], expected: JobState) -> None:
    assert job_state(job) == expected


def test_summary_line() -> None:
    assert summary_line({}) == "-"
    assert summary_line({"a/m": {}}) == "-"
    assert summary_line({"a/m": {"x": 0.5, "y": 9.0}, "b/m": {"z": 1.0}}) == "0.750 mean of 2"


def test_merge_conditions_keeps_transition_time_while_status_holds() -> None:
    old = [
        condition("Ready", True, "Running", "x", 1).model_copy(
            update={"last_transition_time": "T0"}
        ),
        condition("Scheduled", True, "RunCreated", "w", 1),
    ]
    same = merge_conditions(old, [condition("Ready", True, "Completed", "y", 1)])
    assert [(c.type, c.last_transition_time, c.reason) for c in same] == [
        ("Ready", "T0", "Completed")
    ]
    flipped = merge_conditions(old, [condition("Ready", False, "UnitsFailed", "z", 1)])
    assert flipped[0].last_transition_time != "T0"
    kept = merge_conditions(old, [condition("Ready", True, "Valid", "v", 2)], keep_others=True)
    assert [c.type for c in kept] == ["Ready", "Scheduled"]


def test_budget_refusals_sum_what_the_units_reported() -> None:
    from evalkube.controller.run_reconciler import budget_refusals

    reports = [
        {"kind": "shard", "budgetRefused": {"execution": 9, "unit": 1}},
        {"kind": "shard", "budgetRefused": {"execution": 3}},
        {"kind": "shard"},  # a runner from before refusals were reported
        {"budgetRefused": "lots"},  # malformed: adds nothing
        {"budgetRefused": {"execution": -5, "unit": True, "unknown_execution": 2}},
    ]
    assert budget_refusals(reports) == {"execution": 12, "unit": 1, "unknown_execution": 2}


# -- Kueue: suspended Jobs ----------------------------------------------------------------------
QUEUED = JobState("queued")


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"spec": {"suspend": True}}, QUEUED),
        (
            {
                "spec": {"suspend": True},
                "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
            },
            QUEUED,
        ),
        ({"spec": {"suspend": False}, "status": {"active": 1}}, ACTIVE),
        # finished Jobs are finished, suspended or not (Kueue may leave the flag)
        ({"spec": {"suspend": True}, **_job({"type": "Complete", "status": "True"})}, SUCCEEDED),
        (
            {
                "spec": {"suspend": True},
                **_job({"type": "Failed", "status": "True", "reason": "X"}),
            },
            JobState("failed", "X"),
        ),
    ],
)
def test_a_suspended_unfinished_job_is_queued(job: dict[str, Any], expected: JobState) -> None:
    assert job_state(job) == expected


def test_queued_units_hold_their_slot_and_are_counted() -> None:
    units = units_of(("qa", 30, False))
    jobs = {"qa.m.00000": QUEUED, "qa.m.00001": ACTIVE}
    decision = decide(units, jobs, set(), parallelism=2)
    assert decision.create == []  # a queued Job is not re-created, and holds its slot
    assert decision.phase == "Running"
    assert decision.counts().to_wire() == {
        "total": 3,
        "succeeded": 0,
        "running": 2,
        "failed": 0,
        "pending": 1,
        "queued": 1,
    }
