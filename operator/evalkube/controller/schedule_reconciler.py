"""Reconcile one EvalSchedule: read its runs, prune the history, create the due run, report.

Each schedule has a kopf daemon (:mod:`evalkube.controller.handlers`) that makes a pass when
the schedule or one of its runs changes, and otherwise sleeps until the schedule's next time:
its runs come from kopf's index of scheduled runs, so no pass lists anything. The decisions
are the pure functions of :mod:`evalkube.controller.schedule_decisions`; this module does the I/O
around them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import kopf

from evalkube.controller.kube import EvalScheduleResource, Kube
from evalkube.controller.run_reconciler import FINAL_PHASES, EventSink
from evalkube.controller.schedule_decisions import (
    ANNOTATION_SCHEDULED_AT,
    Due,
    ScheduledRun,
    decide,
    format_time,
    next_due,
    parse_time,
    run_manifest,
    runs_to_prune,
)
from evalkube.controller.settings import OperatorSettings
from evalkube.controller.wakeups import Wakeups, sleep
from evalkube.models import (
    Condition,
    EvalScheduleSpec,
    EvalScheduleStatus,
    RunReference,
    SpecError,
    validate_spec,
)
from evalkube.models.status import condition, merge_conditions, read_status, same_status

Clock = Callable[[], datetime]
#: ``(namespace, schedule uid) -> the runs it owns``, each as :func:`index_entry` keeps it:
#: kopf's index of scheduled runs (``handlers.scheduled_runs``), kept current by the watch.
RunIndex = Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
_log = logging.getLogger(__name__)


def index_entry(body: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """What the index of scheduled runs keeps of a run, under its owning schedule: the few
    fields a pass reads, not the whole object."""
    meta = body.get("metadata") or {}
    owners = [
        o.get("uid")
        for o in meta.get("ownerReferences") or []
        if o.get("kind") == "EvalSchedule" and o.get("uid")
    ]
    if not owners:
        return {}
    status = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    entry = {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "annotations": {k: v for k, v in annotations.items() if k == ANNOTATION_SCHEDULED_AT},
        },
        "status": {k: status[k] for k in ("phase", "completedAt") if k in status},
    }
    namespace = str(meta.get("namespace") or "")
    return {(namespace, str(owner)): entry for owner in owners}


class ScheduleReconciler:
    """Creates the EvalRuns of every EvalSchedule the operator watches."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        event: EventSink | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.event = event or (lambda body, kind, reason, message: None)
        offset = timedelta(seconds=settings.schedule_clock_offset_seconds)
        self.clock = clock or (lambda: datetime.now(UTC) + offset)
        self.runs: RunIndex = {}
        """kopf's index of scheduled runs (``handlers.scheduled_runs``)."""
        self._wakeups = Wakeups()

    async def drive(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """The body of the schedule's kopf daemon: a pass, then sleep until the schedule's
        next time, a :meth:`wake` (the schedule or one of its runs changed) or
        ``reconcile_interval`` (a missed event), whichever comes first. ``body`` is kopf's
        live view of the schedule: each pass reads it as it is now."""
        failures = 0
        with self._wakeups.held((namespace, name)) as wakeup:
            while True:
                wakeup.clear()
                wait = self.settings.reconcile_interval
                try:
                    new = await self.reconcile(body)
                    if new is not None:
                        wire = new.to_wire()
                        await self.kube.patch_status(EvalScheduleResource, namespace, name, wire)
                    status = new or read_status(EvalScheduleStatus, body.get("status"))
                    wait = self._until(parse_time(status.next_schedule_time), wait)
                    failures = 0
                except Exception:  # the daemon goes on: its next pass may succeed
                    failures += 1
                    _log.exception("a pass over EvalSchedule %s/%s failed", namespace, name)
                    wait = min(wait, self.settings.retry_interval * 2 ** min(failures, 5))
                await sleep(wakeup, wait)

    def wake(self, namespace: str, name: str) -> None:
        """Ask for a pass over the schedule (its spec or one of its runs changed)."""
        self._wakeups.wake((namespace, name))

    def _until(self, when: datetime | None, most: float) -> float:
        """Seconds until ``when`` on the schedule's clock (a little after, so the time is
        due when the pass comes), at most ``most``."""
        if when is None:
            return most
        return max(0.0, min(most, (when - self.clock()).total_seconds() + _LATE))

    async def reconcile(self, body: Mapping[str, Any]) -> EvalScheduleStatus | None:
        """One pass; the status to patch, or ``None`` when it is unchanged."""
        meta = body["metadata"]
        namespace, generation = meta["namespace"], meta.get("generation")
        old = read_status(EvalScheduleStatus, body.get("status"))
        new = old.model_copy(update={"observed_generation": generation})
        try:
            spec = validate_spec(EvalScheduleSpec, dict(body.get("spec") or {}), prefix="spec")
        except SpecError as exc:
            message = "; ".join(exc.problems)[:4000]
            invalid = condition("Ready", False, "InvalidSpec", message, generation)
            new.conditions = merge_conditions(old.conditions, [invalid])
            return None if same_status(new, old) else new
        runs = [dict(r) for r in self.runs.get((namespace, meta["uid"]), ())]
        active = [r for r in runs if _status(r).get("phase") not in FINAL_PHASES]
        history = [_scheduled(r) for r in runs]
        limits = spec.successful_runs_history_limit, spec.failed_runs_history_limit
        for gone in runs_to_prune(history, *limits):
            await self.kube.delete_run(namespace, gone)
        times = [parse_time(old.last_schedule_time), *(r.scheduled for r in history)]
        last_scheduled = max(filter(None, times), default=None)
        created = parse_time(meta.get("creationTimestamp")) or self.clock()
        due = next_due(
            spec.schedule,
            spec.zone(),
            last_scheduled or created,
            self.clock(),
            starting_deadline_seconds=spec.starting_deadline_seconds,
        )
        scheduled: list[Condition] = []
        if due.time is not None:
            reason, active = await self._fire(body, spec, due, active)
            message = _MESSAGES[reason].format(format_time(due.time))
            run_created = reason == "RunCreated"
            scheduled = [condition("Scheduled", run_created, reason, message, generation)]
            if run_created:
                last_scheduled = due.time
        succeeded = [
            _status(r).get("completedAt") for r in runs if _status(r).get("phase") == "Succeeded"
        ]
        successes = [*map(parse_time, succeeded), parse_time(old.last_successful_time)]
        last_success = max(filter(None, successes), default=None)
        new.last_schedule_time = format_time(last_scheduled) if last_scheduled else None
        new.last_successful_time = format_time(last_success) if last_success else None
        new.next_schedule_time = format_time(due.next)
        new.active = [
            RunReference(name=r["metadata"]["name"], uid=r["metadata"].get("uid")) for r in active
        ]
        valid = f"schedule {spec.schedule!r} in {spec.zone().key}"
        # an old Scheduled condition stays until the next scheduled time says what it did
        new.conditions = merge_conditions(
            old.conditions,
            [condition("Ready", True, "Valid", valid, generation), *scheduled],
            keep_others=True,
        )
        return None if same_status(new, old) else new

    async def _fire(
        self,
        body: Mapping[str, Any],
        spec: EvalScheduleSpec,
        due: Due,
        active: list[dict[str, Any]],
    ) -> tuple[str, list[dict[str, Any]]]:
        """Act on a due time: the Scheduled condition's reason and the active runs after."""
        when = due.time
        assert when is not None
        if spec.suspend:
            return "Suspended", active
        if due.too_late:
            return "MissedStartingDeadline", active
        action = decide(spec.concurrency_policy, len(active))
        if action == "skip":
            return "ConcurrencyForbidden", active
        namespace = body["metadata"]["namespace"]
        if action == "replace":
            for old in active:
                await self.kube.delete_run(namespace, old["metadata"]["name"])
                self.event(body, "Normal", "RunReplaced", f"deleted {old['metadata']['name']}")
            active = []
        manifest = run_manifest(body, when)
        # owned, but not kopf.adopt: that also copies the schedule's labels, and Argo CD's
        # tracking label on a run would make Argo CD prune it as not in Git
        kopf.append_owner_reference(manifest, owner=cast(kopf.Body, body))
        name = manifest["metadata"]["name"]
        created = await self.kube.create_object(manifest)
        if created is not None:
            self.event(body, "Normal", "RunCreated", f"created {name} for {format_time(when)}")
            manifest = created
        return "RunCreated", [*active, manifest]


def _status(run: Mapping[str, Any]) -> Mapping[str, Any]:
    return run.get("status") or {}


def _scheduled(run: Mapping[str, Any]) -> ScheduledRun:
    meta = run["metadata"]
    at = parse_time((meta.get("annotations") or {}).get(ANNOTATION_SCHEDULED_AT))
    return ScheduledRun(
        meta["name"],
        _status(run).get("phase") or "Pending",
        at or parse_time(meta.get("creationTimestamp")) or datetime.min.replace(tzinfo=UTC),
    )


#: Seconds after a scheduled time its pass comes: the time is due then, whatever the rounding.
_LATE = 0.05
#: The Scheduled condition's message by its reason.
_MESSAGES = {
    "RunCreated": "created the run of {}",
    "Suspended": "suspended: no run for {}",
    "MissedStartingDeadline": "{} was missed by more than startingDeadlineSeconds; skipped",
    "ConcurrencyForbidden": "a run is still active: {} waits (concurrencyPolicy Forbid)",
}
