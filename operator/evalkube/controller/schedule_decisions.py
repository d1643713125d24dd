"""The arithmetic of an EvalSchedule: which scheduled time is due, whether a run may start,
which finished runs go, and the EvalRun a scheduled time creates.

Pure functions over explicit clocks (no kopf, no cluster), called by
:mod:`evalkube.controller.schedule_reconciler` on every pass and unit-tested with fixed clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim

from evalkube.controller.names import DOMAIN, fit
from evalkube.models.schedule import ConcurrencyPolicy, cron_expression

LABEL_SCHEDULE = f"{DOMAIN}/schedule"
ANNOTATION_SCHEDULED_AT = f"{DOMAIN}/scheduled-at"
#: Scheduled times are first looked for in this window before ``now`` (every dense schedule
#: has one there), so an operator that was down for a month does not walk every minute of it.
_RECENT = timedelta(days=2)

Action = Literal["create", "skip", "replace"]


@dataclass(frozen=True)
class Due:
    """What the clock says at ``now``."""

    time: datetime | None
    """The latest scheduled time in ``(last, now]`` (UTC), or None when none has come."""
    too_late: bool
    """``time`` was missed by more than ``startingDeadlineSeconds``: skip it."""
    next: datetime
    """The first scheduled time after ``now`` (UTC)."""


def next_due(
    schedule: str,
    tz: ZoneInfo,
    last: datetime,
    now: datetime,
    *,
    starting_deadline_seconds: int | None = None,
) -> Due:
    """The scheduled time to run at ``now`` when the last one run (or the schedule's creation)
    was ``last``. Missed times collapse into the latest, as CronJob does; wall-clock times that
    a DST change skips run at the first minute after the gap, repeated ones once."""
    expression = cron_expression(schedule)
    latest: datetime | None = None
    upcoming: datetime | None = None
    start = max(last, now - _RECENT)
    for begin in (start, last) if start > last else (last,):
        for value in CronSim(expression, begin.astimezone(tz)):
            when = value.astimezone(UTC)
            if when > now:
                upcoming = when
                break
            latest = when
        if latest is not None:
            break
    too_late = (
        latest is not None
        and starting_deadline_seconds is not None
        and (now - latest).total_seconds() > starting_deadline_seconds
    )
    assert upcoming is not None  # a cron iterator never ends
    return Due(latest, too_late, upcoming)


def decide(concurrency: ConcurrencyPolicy, active: int) -> Action:
    """What a due time does given the number of the schedule's active runs."""
    if not active or concurrency == "Allow":
        return "create"
    return "skip" if concurrency == "Forbid" else "replace"


@dataclass(frozen=True)
class ScheduledRun:
    """One of the schedule's EvalRuns as the pruning sees it."""

    name: str
    phase: str
    scheduled: datetime


def runs_to_prune(
    runs: Sequence[ScheduledRun], successful_limit: int, failed_limit: int
) -> list[str]:
    """Names of finished runs beyond the history limits, oldest scheduled first."""
    out: list[str] = []
    for phase, limit in (("Succeeded", successful_limit), ("Failed", failed_limit)):
        finished = sorted((r for r in runs if r.phase == phase), key=lambda r: r.scheduled)
        out.extend(r.name for r in finished[: max(len(finished) - limit, 0)])
    return out


def run_name(schedule_name: str, scheduled: datetime) -> str:
    """The EvalRun of one scheduled time: minutes since the epoch, as CronJob names Jobs, so a
    restarted operator re-creating it gets a conflict instead of a duplicate."""
    return fit(schedule_name, str(int(scheduled.timestamp()) // 60), 253)


def schedule_label(schedule_name: str) -> str:
    """The ``evalkube.io/schedule`` label value (a label value has at most 63 characters)."""
    return schedule_name if len(schedule_name) <= 63 else fit(schedule_name[:40], "s", 63)


def format_time(when: datetime) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339), or None."""
    return datetime.fromisoformat(text).astimezone(UTC) if text else None


def run_manifest(schedule: Mapping[str, Any], scheduled: datetime) -> dict[str, Any]:
    """The EvalRun of ``scheduled`` from the schedule's ``runTemplate`` (spec as written)."""
    meta = schedule["metadata"]
    template = schedule["spec"]["runTemplate"]
    template_meta = template.get("metadata") or {}
    return {
        "apiVersion": schedule.get("apiVersion", f"{DOMAIN}/v1alpha1"),
        "kind": "EvalRun",
        "metadata": {
            "name": run_name(meta["name"], scheduled),
            "namespace": meta["namespace"],
            "labels": {
                **(template_meta.get("labels") or {}),
                LABEL_SCHEDULE: schedule_label(meta["name"]),
            },
            "annotations": {
                **(template_meta.get("annotations") or {}),
                ANNOTATION_SCHEDULED_AT: format_time(scheduled),
            },
        },
        "spec": dict(template["spec"]),
    }
