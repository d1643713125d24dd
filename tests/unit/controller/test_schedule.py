"""The EvalSchedule arithmetic (evalkube.controller.schedule_decisions) on fixed clocks, and the
spec's validation: due times (missed ones, deadlines, DST changes), concurrency, history pruning,
deterministic run names and the run a scheduled time creates."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from evalkube.controller.schedule_decisions import (
    ANNOTATION_SCHEDULED_AT,
    LABEL_SCHEDULE,
    ScheduledRun,
    decide,
    next_due,
    run_manifest,
    run_name,
    runs_to_prune,
    schedule_label,
)
from evalkube.models import EvalScheduleSpec, SpecError, validate_spec

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# -- next_due ---------------------------------------------------------------------------------


def test_nothing_is_due_before_the_first_scheduled_time() -> None:
    due = next_due("*/5 * * * *", UTC_ZONE, utc(2026, 5, 1, 10, 1), utc(2026, 5, 1, 10, 4, 59))
    assert due.time is None
    assert due.next == utc(2026, 5, 1, 10, 5)


def test_a_scheduled_time_is_due_from_its_minute_on() -> None:
    due = next_due("*/5 * * * *", UTC_ZONE, utc(2026, 5, 1, 10, 1), utc(2026, 5, 1, 10, 5))
    assert due.time == utc(2026, 5, 1, 10, 5)
    assert due.next == utc(2026, 5, 1, 10, 10)
    # once run (``last`` moved to it), the same time is not due again
    again = next_due("*/5 * * * *", UTC_ZONE, utc(2026, 5, 1, 10, 5), utc(2026, 5, 1, 10, 9))
    assert again.time is None


def test_missed_times_collapse_into_the_latest() -> None:
    # the operator was down from 02:00 to 05:20: one run, for 05:00
    due = next_due("0 * * * *", UTC_ZONE, utc(2026, 5, 1, 1, 0), utc(2026, 5, 1, 5, 20))
    assert due.time == utc(2026, 5, 1, 5, 0)
    assert not due.too_late


def test_starting_deadline_skips_a_time_missed_by_too_much() -> None:
    last, now = utc(2026, 5, 1, 1, 0), utc(2026, 5, 1, 5, 20)
    late = next_due("0 * * * *", UTC_ZONE, last, now, starting_deadline_seconds=600)
    assert (late.time, late.too_late) == (utc(2026, 5, 1, 5, 0), True)
    in_time = next_due("0 * * * *", UTC_ZONE, last, now, starting_deadline_seconds=1200)
    assert (in_time.time, in_time.too_late) == (utc(2026, 5, 1, 5, 0), False)


def test_a_sparse_schedule_is_found_after_a_long_outage() -> None:
    due = next_due("@yearly", UTC_ZONE, utc(2020, 1, 1, 0, 0), utc(2026, 6, 1))
    assert due.time == utc(2026, 1, 1)
    assert due.next == utc(2027, 1, 1)


def test_time_zone_reads_the_schedule_in_local_time() -> None:
    # 09:00 on weekdays in New York: 13:00 UTC in summer (EDT), 14:00 UTC in winter (EST)
    ny = ZoneInfo("America/New_York")
    summer = next_due("0 9 * * 1-5", ny, utc(2026, 7, 1, 0, 0), utc(2026, 7, 1, 20, 0))
    assert summer.time == utc(2026, 7, 1, 13, 0)
    winter = next_due("0 9 * * 1-5", ny, utc(2026, 12, 1, 0, 0), utc(2026, 12, 1, 20, 0))
    assert winter.time == utc(2026, 12, 1, 14, 0)
    # Friday 2026-07-03 after 09:00: next is Monday 07-06
    friday = next_due("0 9 * * 1-5", ny, utc(2026, 7, 3, 13, 0), utc(2026, 7, 3, 20, 0))
    assert (friday.time, friday.next) == (None, utc(2026, 7, 6, 13, 0))


def test_a_time_the_spring_change_skips_runs_right_after_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist
    before = next_due("30 2 * * *", BERLIN, utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 0, 59))
    assert before.time is None
    assert before.next == utc(2026, 3, 29, 1, 0)  # 03:00 CEST
    due = next_due("30 2 * * *", BERLIN, utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 1, 0))
    assert due.time == utc(2026, 3, 29, 1, 0)
    assert due.next == utc(2026, 3, 30, 0, 30)  # 02:30 CEST the day after


def test_a_time_the_autumn_change_repeats_runs_once() -> None:
    # Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice
    first = next_due("30 2 * * *", BERLIN, utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 0, 30))
    assert first.time == utc(2026, 10, 25, 0, 30)  # 02:30 CEST
    assert first.time is not None
    second = next_due("30 2 * * *", BERLIN, first.time, utc(2026, 10, 25, 1, 30))
    assert second.time is None  # not again at 02:30 CET
    assert second.next == utc(2026, 10, 26, 1, 30)


def test_hourly_runs_every_real_hour_across_both_changes() -> None:
    for start in (utc(2026, 3, 28, 22, 30), utc(2026, 10, 24, 22, 30)):
        seen, last = [], start
        for hour in range(6):
            now = start.replace(minute=31) + (utc(2026, 1, 1, hour + 1) - utc(2026, 1, 1, 0))
            due = next_due("0 * * * *", BERLIN, last, now)
            assert due.time is not None
            seen.append(due.time)
            last = due.time
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(seen)}
        assert gaps == {3600.0}, seen


# -- decide -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "active", "action"),
    [
        ("Allow", 0, "create"),
        ("Allow", 2, "create"),
        ("Forbid", 0, "create"),
        ("Forbid", 1, "skip"),
        ("Replace", 0, "create"),
        ("Replace", 1, "replace"),
    ],
)
def test_decide_follows_the_concurrency_policy(policy: Any, active: int, action: str) -> None:
    assert decide(policy, active) == action


# -- runs_to_prune ----------------------------------------------------------------------------


def test_history_limits_prune_the_oldest_finished_runs_of_each_phase() -> None:
    runs = [
        ScheduledRun(f"r{i}", phase, utc(2026, 5, 1, i))
        for i, phase in enumerate(
            ["Succeeded", "Failed", "Succeeded", "Failed", "Succeeded", "Running", "Pending"]
        )
    ]
    assert runs_to_prune(list(reversed(runs)), 2, 1) == ["r0", "r1"]
    assert runs_to_prune(runs, 0, 0) == ["r0", "r2", "r4", "r1", "r3"]
    assert runs_to_prune(runs, 5, 5) == []


# -- names and the run manifest -----------------------------------------------------------------


def test_run_names_are_deterministic_per_scheduled_time() -> None:
    at = utc(2026, 5, 1, 2, 0)
    assert run_name("nightly", at) == f"nightly-{int(at.timestamp()) // 60}"
    assert run_name("nightly", at) == run_name("nightly", at.astimezone(BERLIN))
    assert run_name("nightly", at) != run_name("nightly", utc(2026, 5, 2, 2, 0))
    long = run_name("n" * 253, at)
    assert len(long) <= 253
    assert long != run_name("n" * 252 + "m", at)
    assert len(schedule_label("s" * 100)) <= 63
    assert schedule_label("nightly") == "nightly"


def test_the_run_manifest_copies_the_template_and_marks_the_schedule() -> None:
    schedule = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSchedule",
        "metadata": {"name": "nightly", "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "schedule": "0 2 * * *",
            "runTemplate": {
                "metadata": {"labels": {"team": "qa"}, "annotations": {"note": "x"}},
                "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]},
            },
        },
    }
    manifest = run_manifest(schedule, utc(2026, 5, 1, 2, 0))
    assert manifest["kind"] == "EvalRun"
    assert manifest["metadata"]["namespace"] == "team-a"
    assert manifest["metadata"]["labels"] == {"team": "qa", LABEL_SCHEDULE: "nightly"}
    assert manifest["metadata"]["annotations"] == {
        "note": "x",
        ANNOTATION_SCHEDULED_AT: "2026-05-01T02:00:00Z",
    }
    assert manifest["spec"] == {"suiteRef": {"name": "qa"}, "models": ["precomputed"]}


# -- the spec ---------------------------------------------------------------------------------

TEMPLATE = {"spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]}}


def schedule_problems(**fields: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec(EvalScheduleSpec, {"runTemplate": TEMPLATE, **fields}, prefix="spec")
    return info.value.problems


def test_spec_defaults_follow_cronjob() -> None:
    spec = validate_spec(EvalScheduleSpec, {"schedule": "@daily", "runTemplate": TEMPLATE})
    assert spec.concurrency_policy == "Forbid"
    assert (spec.successful_runs_history_limit, spec.failed_runs_history_limit) == (3, 1)
    assert not spec.suspend
    assert spec.zone().key == "UTC"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"schedule": "every day"}, "spec.schedule"),
        ({"schedule": "61 * * * *"}, "not a valid cron schedule"),
        ({"schedule": "0 0 * * * *"}, "five fields"),
        ({"schedule": "@daily", "timeZone": "Mars/Olympus"}, "spec.timeZone"),
        ({"schedule": "@daily", "concurrencyPolicy": "Queue"}, "spec.concurrencyPolicy"),
        ({"schedule": "@daily", "startingDeadlineSeconds": -1}, "spec.startingDeadlineSeconds"),
    ],
)
def test_bad_specs_name_the_field(fields: dict[str, Any], needle: str) -> None:
    assert any(needle in p for p in schedule_problems(**fields)), schedule_problems(**fields)


def test_the_template_is_checked_as_an_evalrun_spec() -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(
            EvalScheduleSpec,
            {"schedule": "@daily", "runTemplate": {"spec": {"models": ["openai:gpt-4o"]}}},
            prefix="spec",
        )
    assert any("spec.runTemplate.spec" in p and "openai" in p for p in info.value.problems)
