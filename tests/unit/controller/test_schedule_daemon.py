"""An EvalSchedule's daemon (evalkube.controller.schedule_reconciler): it reads its runs from kopf's
index, never from a LIST; it sleeps until the schedule's next time, not a fixed tick; an
event wakes it at once; and the index keeps only what a pass reads."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from evalkube.controller.schedule_decisions import ANNOTATION_SCHEDULED_AT, run_name
from evalkube.controller.schedule_reconciler import ScheduleReconciler, index_entry
from evalkube.controller.settings import OperatorSettings


class RecordingKube:
    """The API calls a schedule's passes make; it has no way to list anything."""

    def __init__(self, schedule: dict[str, Any]) -> None:
        self.schedule = schedule
        self.created: list[tuple[float, str]] = []
        self.patches = 0

    async def create_object(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.created.append((time.monotonic(), manifest["metadata"]["name"]))
        return {**manifest, "metadata": {**manifest["metadata"], "uid": f"u{len(self.created)}"}}

    async def patch_status(self, kind: Any, namespace: str, name: str, status: Any) -> None:
        self.patches += 1
        self.schedule["status"] = {**(self.schedule.get("status") or {}), **status}

    async def delete_run(self, namespace: str, name: str) -> None:
        raise AssertionError("nothing to prune")


def schedule(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSchedule",
        "metadata": {
            "name": "nightly",
            "namespace": "ns",
            "uid": "s-1",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Allow",
            "runTemplate": {"spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]}},
            **spec,
        },
    }


def a_clock_just_before_a_minute(seconds: float) -> Any:
    """A clock ``seconds`` before a minute boundary now, moving with real time."""
    minute = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    start = time.monotonic()
    return lambda: minute - timedelta(seconds=seconds) + timedelta(seconds=time.monotonic() - start)


def test_the_daemon_sleeps_until_the_next_time_and_lists_nothing() -> None:
    body = schedule()
    kube = RecordingKube(body)
    settings = OperatorSettings(reconcile_interval=30)
    clock_started = time.monotonic()
    schedules = ScheduleReconciler(kube, settings, clock=a_clock_just_before_a_minute(0.6))  # type: ignore[arg-type]

    async def scenario() -> None:
        started = time.monotonic()
        task = asyncio.create_task(schedules.drive("ns", "nightly", body))
        while len(kube.created) < 2 and time.monotonic() - started < 10:
            await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    (first_at, first), (second_at, second) = kube.created[:2]
    assert first == run_name("nightly", datetime(2026, 6, 1, 11, 59, tzinfo=UTC))  # due at start
    # 12:00, 0.6 s on the clock later: the daemon slept until then (not before: the lower
    # bound counts from the clock's start, whenever a loaded machine let the first run come),
    # and not for a fixed tick
    assert second == run_name("nightly", datetime(2026, 6, 1, 12, 0, tzinfo=UTC))
    assert second_at - clock_started >= 0.6
    assert second_at - first_at < 2.0
    assert body["status"]["nextScheduleTime"] == "2026-06-01T12:01:00Z"


def test_an_event_wakes_the_daemon_at_once() -> None:
    """Forbid holds 12:00 back while the 11:59 run is active; that run's event (it finished)
    wakes the daemon, which creates the 12:00 run at once instead of at 12:01."""
    body = schedule(concurrencyPolicy="Forbid")
    body["status"] = {"lastScheduleTime": "2026-06-01T11:59:00Z"}
    kube = RecordingKube(body)
    schedules = ScheduleReconciler(
        kube,  # type: ignore[arg-type]
        OperatorSettings(reconcile_interval=30),
        clock=lambda: datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC),
    )
    run = {
        "metadata": {
            "name": run_name("nightly", datetime(2026, 6, 1, 11, 59, tzinfo=UTC)),
            "namespace": "ns",
            "uid": "r-1",
            "annotations": {ANNOTATION_SCHEDULED_AT: "2026-06-01T11:59:00Z"},
            "ownerReferences": [{"kind": "EvalSchedule", "name": "nightly", "uid": "s-1"}],
        },
        "status": {"phase": "Running"},
    }
    index = {("ns", "s-1"): [index_entry(run)[("ns", "s-1")]]}
    schedules.runs = index

    async def scenario() -> float:
        task = asyncio.create_task(schedules.drive("ns", "nightly", body))
        while not kube.patches:
            await asyncio.sleep(0.01)
        assert kube.created == []  # held back
        run["status"] = {"phase": "Succeeded", "completedAt": "2026-06-01T12:00:20Z"}
        index[("ns", "s-1")] = [index_entry(run)[("ns", "s-1")]]
        woken = time.monotonic()
        schedules.wake("ns", "nightly")
        while not kube.created:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return kube.created[0][0] - woken

    assert asyncio.run(scenario()) < 1.0  # not the 30 s the daemon would otherwise sleep
    assert kube.created[0][1] == run_name("nightly", datetime(2026, 6, 1, 12, 0, tzinfo=UTC))
    assert body["status"]["lastSuccessfulTime"] == "2026-06-01T12:00:20Z"


def test_the_index_keeps_a_run_under_its_schedule_with_only_what_a_pass_reads() -> None:
    run = {
        "metadata": {
            "name": "nightly-1",
            "namespace": "ns",
            "uid": "r-1",
            "creationTimestamp": "2026-06-01T12:00:01Z",
            "labels": {"evalkube.io/schedule": "nightly", "team": "qa"},
            "annotations": {ANNOTATION_SCHEDULED_AT: "2026-06-01T12:00:00Z", "big": "x" * 1000},
            "ownerReferences": [{"kind": "EvalSchedule", "name": "nightly", "uid": "s-1"}],
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"suiteRef": {"name": "qa"}},
        "status": {"phase": "Running", "results": [{"task": "qa"}], "units": {"total": 9}},
    }
    assert index_entry(run) == {
        ("ns", "s-1"): {
            "metadata": {
                "name": "nightly-1",
                "uid": "r-1",
                "creationTimestamp": "2026-06-01T12:00:01Z",
                "annotations": {ANNOTATION_SCHEDULED_AT: "2026-06-01T12:00:00Z"},
            },
            "status": {"phase": "Running"},
        }
    }
    run["metadata"]["ownerReferences"] = [{"kind": "Deployment", "uid": "d"}]
    assert index_entry(run) == {}  # labelled by hand, owned by no schedule: not its run
