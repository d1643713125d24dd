"""Every kopf handler of evalkube, each a few lines over the reconcile logic.

Import this module only to run the operator (``evalkube operator``): importing it registers
the handlers with kopf.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any, cast

import kopf

from evalkube import limits
from evalkube.controller import names
from evalkube.controller.run_decisions import job_index_entry, job_state
from evalkube.controller.run_reconciler import RunReconciler
from evalkube.controller.schedule_decisions import LABEL_SCHEDULE
from evalkube.controller.schedule_reconciler import ScheduleReconciler
from evalkube.controller.schedule_reconciler import index_entry as schedule_index_entry
from evalkube.controller.settings import OperatorSettings
from evalkube.controller.snapshot import config_map_refs
from evalkube.controller.state import OperatorState
from evalkube.models.status import cap_message

GROUP, VERSION = "evalkube.io", "v1alpha1"
UNIT_JOBS: dict[str, Any] = {
    names.LABEL_MANAGED_BY: names.MANAGED_BY,
    names.LABEL_RUN: kopf.PRESENT,
}


class DiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff-base storage (annotations), without copying objects for nothing.

    kopf builds an object's "essence" (a deep copy of the whole body, status and managedFields
    included, most of which it then drops) on every event of every object it watches. Only
    objects with change or daemon handlers use it: evalkube's own kinds. The Jobs and
    ConfigMaps whose events evalkube only reads (``kopf.on.event``, indexes) get an empty
    one, which nothing reads (a kind of another API group given a change or daemon
    handler must be let through here)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        if str(body.get("apiVersion", "")).partition("/")[0] != GROUP:
            return cast(kopf.BodyEssence, {})
        return super().build(body=body, extra_fields=extra_fields)


def _post_event(body: Any, kind: str, reason: str, message: str) -> None:
    message = cap_message(message, limits.EVENT_MESSAGE_CHARS)
    (kopf.warn if kind == "Warning" else kopf.info)(body, reason=reason, message=message)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="evalkube.io")
    settings.persistence.diffbase_storage = DiffBaseStorage(prefix="evalkube.io")
    settings.posting.level = 20
    settings.watching.label_selectors["batch", "jobs"] = names.UNIT_JOBS_SELECTOR
    operator_settings = OperatorSettings()
    if operator_settings.watched_namespaces():
        # namespace-scoped RBAC (watchNamespaces): no cluster-wide reads of namespaces or CRDs
        settings.scanning.disabled = True
    if operator_settings.peering:  # the chart's (Cluster)KopfPeering object, not kopf's default
        settings.peering.name = operator_settings.peering_name
        settings.peering.mandatory = True
        # kopf pauses every replica that sees a live peer of its own priority, so replicas of
        # one Deployment (all priority 0) would all pause and no run would advance: each
        # replica draws its own (1..2^31-1: distinct replicas collide with odds of about one in
        # two billion), and the highest live one is the leader
        settings.peering.priority = secrets.randbelow(2**31 - 1) + 1
    memo.state = await OperatorState.start(operator_settings, _post_event)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.state.close()


@kopf.on.create(GROUP, VERSION, "evalsuites")
@kopf.on.update(GROUP, VERSION, "evalsuites", field="spec")
@kopf.on.resume(GROUP, VERSION, "evalsuites")
async def suite_changed(body: kopf.Body, patch: kopf.Patch, memo: Any, **_: Any) -> None:
    state: OperatorState = memo.state
    patch.status.update(await state.suite_status(body))


@kopf.index(GROUP, VERSION, "evalsuites")
def suite_config_maps(namespace: str | None, name: str, spec: Any, **_: Any) -> dict[Any, str]:
    """``(namespace, ConfigMap) -> suite``: the grader files and datasets each suite reads."""
    refs = [
        ref for task in spec.get("tasks") or [] for ref in config_map_refs(namespace or "", task)
    ]
    return {(ns, config_map): name for ns, config_map, _ in refs}


def _read_by_a_suite(**kwargs: Any) -> bool:
    return (kwargs["namespace"], kwargs["name"]) in kwargs["suite_config_maps"]


@kopf.on.event("", "v1", "configmaps", when=_read_by_a_suite)
async def suite_file_changed(namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    """A grader file or dataset a suite reads was edited: its version and Ready condition."""
    state: OperatorState = memo.state
    for suite in set(kwargs["suite_config_maps"].get((namespace, name), [])):
        await state.recheck_suite(namespace or "", suite)


@kopf.index("batch", "v1", "jobs", labels=UNIT_JOBS)
def unit_jobs(
    namespace: str | None, labels: Any, annotations: Any, body: Any, **_: Any
) -> dict[Any, Any]:
    """``(namespace, run) -> (unit id, state)`` of every work-unit Job: runs read their Jobs
    here instead of listing them on each pass."""
    return job_index_entry(namespace or "", labels, annotations, body)


def _runs(memo: Any, kwargs: dict[str, Any]) -> RunReconciler:
    reconciler: RunReconciler = memo.state.reconciler
    reconciler.jobs = kwargs["unit_jobs"]  # the same live index every time; kopf keeps it current
    return reconciler


#: Seconds a stopping run daemon (run deleted, operator paused or exiting) gets before kopf
#: cancels it: a pass in flight is cut short, and the next daemon starts with a fresh pass.
RUN_DAEMON_CANCELLATION_SECONDS = 5.0


@kopf.daemon(GROUP, VERSION, "evalruns", cancellation_timeout=RUN_DAEMON_CANCELLATION_SECONDS)
async def run_daemon(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Drives the run from creation (or the operator's start) until it is finished."""
    await _runs(memo, kwargs).drive(namespace or "", name, body)


@kopf.on.event("batch", "v1", "jobs", labels=UNIT_JOBS)
async def unit_job_changed(
    namespace: str | None,
    name: str,
    labels: Any,
    annotations: Any,
    body: Any,
    event: Any,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """A work-unit Job was created, admitted, suspended, finished or deleted: its run gets a
    pass when that changed its state (``RunReconciler.job_changed``)."""
    run = annotations.get(names.ANNOTATION_RUN) or labels[names.LABEL_RUN]
    state = None if event.get("type") == "DELETED" else job_state(body)
    _runs(memo, kwargs).job_changed(namespace or "", run, name, state)


@kopf.on.event(GROUP, VERSION, "evalruns")
async def run_event(
    namespace: str | None,
    name: str,
    meta: Any,
    event: Any,
    memo: Any,
    **_: Any,
) -> None:
    """A run being deleted (or gone) is forgotten: its token no longer accepted, its gauges
    and caches dropped. An event handler, not ``kopf.on.delete``: a changing handler would
    have kopf write its last-handled-configuration annotation on every new run (one more
    API call each), and this also sees runs deleted after their daemon ended."""
    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
        memo.state.reconciler.forget(namespace or "", name)


@kopf.index(GROUP, VERSION, "evalruns", labels={LABEL_SCHEDULE: kopf.PRESENT})
def scheduled_runs(body: Any, **_: Any) -> dict[Any, Any]:
    """``(namespace, schedule uid) -> runs``: what a schedule's pass reads of its runs,
    instead of listing them."""
    return schedule_index_entry(body)


def _schedules(memo: Any, kwargs: dict[str, Any]) -> ScheduleReconciler:
    schedules: ScheduleReconciler = memo.state.schedules
    schedules.runs = kwargs["scheduled_runs"]  # kopf's live index, the same object every time
    return schedules


@kopf.daemon(GROUP, VERSION, "evalschedules", cancellation_timeout=RUN_DAEMON_CANCELLATION_SECONDS)
async def schedule_daemon(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Creates the schedule's runs at their times, for as long as the schedule exists."""
    await _schedules(memo, kwargs).drive(namespace or "", name, body)


@kopf.on.event(GROUP, VERSION, "evalschedules")
async def schedule_event(namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """The schedule was edited (or its status written): a pass reads it as it is now."""
    _schedules(memo, kwargs).wake(namespace or "", name)


@kopf.on.event(GROUP, VERSION, "evalruns", labels={LABEL_SCHEDULE: kopf.PRESENT})
async def scheduled_run_event(
    namespace: str | None, meta: Any, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A schedule's run was created, changed phase or was deleted: a pass over the schedule
    (a held-back time may now be due, the history pruned, the status's ``active`` updated)."""
    schedules = _schedules(memo, kwargs)
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "EvalSchedule":
            schedules.wake(namespace or "", owner.get("name", ""))
