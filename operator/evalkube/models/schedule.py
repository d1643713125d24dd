"""EvalSchedule: EvalRuns created from a template on a cron schedule, modelled on CronJob.

The operator's schedule handler (:mod:`evalkube.controller.schedule_reconciler`) reads this spec and
writes the status; the schedule arithmetic itself is :mod:`evalkube.controller.schedule_decisions`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import Field, field_validator

from evalkube.models.base import SpecModel
from evalkube.models.crd import cluster
from evalkube.models.meta import ObjectMeta
from evalkube.models.run import Condition, EvalRunSpec

#: CronJob's macros, as cron expressions (cronsim reads five fields only).
CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]


def cron_expression(schedule: str) -> str:
    """The five-field expression of ``schedule`` (a macro expanded)."""
    return CRON_MACROS.get(schedule.strip().lower(), schedule.strip())


class RunTemplateMeta(SpecModel):
    """Metadata copied onto each EvalRun the schedule creates."""

    labels: dict[str, str] = Field(
        default_factory=dict, json_schema_extra=cluster(max_properties=64)
    )
    """Labels of each run (the operator adds ``evalkube.io/schedule``)."""
    annotations: dict[str, str] = Field(
        default_factory=dict, json_schema_extra=cluster(max_properties=64)
    )
    """Annotations of each run."""


class RunTemplate(SpecModel):
    """The EvalRun each scheduled time creates."""

    metadata: RunTemplateMeta = Field(default_factory=RunTemplateMeta)
    """Labels and annotations of the runs."""
    spec: EvalRunSpec
    """The runs' spec, as in an EvalRun."""


class EvalScheduleSpec(SpecModel):
    """When to create EvalRuns, how they may overlap, and how many finished ones to keep."""

    schedule: str = Field(min_length=1, max_length=256)
    """Cron expression (five fields: minute hour day-of-month month day-of-week) or a macro
    such as ``@daily``, read in ``timeZone``."""
    time_zone: str | None = Field(default=None, json_schema_extra=cluster(max_length=64))
    """IANA time zone of ``schedule``, e.g. ``Europe/Berlin`` (default: UTC)."""
    concurrency_policy: ConcurrencyPolicy = "Forbid"
    """``Allow`` overlapping runs; ``Forbid`` skips a time while a run is active; ``Replace``
    deletes the active runs and starts the new one."""
    starting_deadline_seconds: int | None = Field(default=None, ge=0)
    """A scheduled time missed by more than this (operator down, Forbid) is skipped."""
    successful_runs_history_limit: int = Field(default=3, ge=0, le=1000)
    """Succeeded runs to keep; older ones are deleted (their scores stay in the store)."""
    failed_runs_history_limit: int = Field(default=1, ge=0, le=1000)
    """Failed runs to keep; older ones are deleted."""
    suspend: bool = False
    """Create no runs while true (active runs continue)."""
    run_template: RunTemplate
    """The EvalRun each scheduled time creates."""

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        expression = cron_expression(value)
        if len(expression.split()) != 5:
            raise ValueError(
                f"{value!r} is not a cron schedule: use five fields "
                "(minute hour day-of-month month day-of-week) or @hourly/@daily/@weekly/..."
            )
        try:
            CronSim(expression, _EPOCH)
        except CronSimError as exc:
            raise ValueError(f"{value!r} is not a valid cron schedule: {exc}") from None
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{value!r} is not an IANA time zone; use a name such as Europe/Berlin or UTC"
            ) from None
        return value

    def zone(self) -> ZoneInfo:
        """The schedule's time zone (UTC when unset)."""
        return ZoneInfo(self.time_zone or "UTC")


class RunReference(SpecModel):
    """An EvalRun the schedule created."""

    name: str
    """EvalRun name."""
    uid: str | None = None
    """EvalRun uid."""


class EvalScheduleStatus(SpecModel):
    """What the schedule did last, and which of its runs are active."""

    observed_generation: int | None = None
    """The spec generation this status describes."""
    last_schedule_time: str | None = None
    """The latest scheduled time a run was created for (RFC 3339)."""
    last_successful_time: str | None = None
    """When the latest Succeeded run of the schedule finished (RFC 3339)."""
    next_schedule_time: str | None = None
    """The next scheduled time after the last one (RFC 3339)."""
    active: list[RunReference] = Field(default_factory=list)
    """The schedule's runs that have not finished."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (the spec is valid) and Scheduled (what the latest pass did)."""


class EvalSchedule(SpecModel):
    """EvalRuns created from a template on a cron schedule (as a CronJob creates Jobs); their
    scores feed the ``lastSucceeded`` baseline of later gates."""

    api_version: Literal["evalkube.io/v1alpha1"] = "evalkube.io/v1alpha1"
    kind: Literal["EvalSchedule"] = "EvalSchedule"
    metadata: ObjectMeta
    spec: EvalScheduleSpec
    status: EvalScheduleStatus | None = None
