"""Run one unit inside a work-unit pod (``evalkube unit``): the runner container's job.

Reads the run's snapshot (a ConfigMap volume), plans the same units the operator planned
(both call :meth:`Snapshot.units`, i.e. :func:`~evalkube.engine.driver.plan_run`), drives the
requested unit in a :class:`~evalkube.engine.session.UnitSession` as ``evalkube run`` does
(which owns model access: budgets and execution tokens on the proxy sidecar through its
control socket), grading in the grader container (through its socket), recording through the
operator's ingest API and reporting the unit done. Exit code 0 only when every sample is stored.
"""

from __future__ import annotations

import time
from typing import Any

from evalkube import limits
from evalkube.engine.driver import BridgeControl
from evalkube.engine.plan import Unit
from evalkube.engine.runtime import TaskRuntime
from evalkube.engine.session import UnitSession
from evalkube.engine.snapshot import PREPARE_UNIT, Prepared, Snapshot, load_snapshot
from evalkube.engine.unit_context import UnitFailed, UnitReport
from evalkube.models.errors import ConfigError
from evalkube.sandbox import SandboxBackend
from evalkube.store.remote import RemoteStore
from evalkube.util.gctune import relaxed_gc

__all__ = ["PREPARE_UNIT", "load_snapshot", "prepare_sources", "run_pod_unit"]


def prepare_sources(snapshot: Snapshot) -> dict[str, Any]:
    """The prepare pod's report (``evalkube prepare``): every ``uri`` source of the suite
    pinned, with each task's row count; or the first source that could not be, named."""
    loaded = snapshot.loaded
    prepared = Prepared()
    loaded.prepares = True
    try:
        for task, part in loaded.uri_sources():
            pin = prepared.pins[f"{task.id}/{part}"] = loaded.pin(task, part)
            if part == "dataset":
                prepared.rows[task.id] = pin.rows
    except ConfigError as exc:
        return {"kind": "prepare", "error": str(exc)[: limits.ERROR_MESSAGE_CHARS]}
    return prepared.to_wire()


def rows_of(snapshot: Snapshot, unit: Unit) -> list[dict[str, Any]]:
    """The dataset rows of a shard unit."""
    from evalkube.engine.loading import shard_rows

    task = snapshot.loaded.task(unit.task_id)
    return shard_rows(snapshot.loaded, task, unit.start, unit.stop)


def run_pod_unit(
    snapshot: Snapshot,
    unit_id: str,
    *,
    store: RemoteStore,
    backend: SandboxBackend,
    bridge: BridgeControl | None = None,
    bridge_control: str | None = None,
    task_id: str | None = None,
) -> UnitReport:
    """Run ``unit_id`` and report it done to the operator.

    ``bridge``: the proxy sidecar (its control listener), which the session configures for the
    unit; ``bridge_control``: the same listener's address, for candidate generation;
    ``task_id``: the unit's task, whose source pins it fetches (``None``: every task's).
    """
    if snapshot.loaded.uri_sources():
        # the row counts and this unit's task's pins, as the prepare pod reported them
        snapshot.apply_pins(Prepared.from_wire(store.prepared(task_id)))
    unit = snapshot.unit(unit_id)
    task = snapshot.loaded.task(unit.task_id)
    started = time.perf_counter()
    with UnitSession(
        snapshot.run_id,
        snapshot.loaded,
        snapshot.spec,
        store,
        backend,
        {task.id: TaskRuntime.build(snapshot.loaded, task)},
        # a retried Job skips what an earlier attempt recorded and takes back the
        # candidates it paid for (and retries failed calls)
        resuming=True,
        bridge=bridge,
        bridge_control=bridge_control,
        pod=True,
    ) as session:  # on the way out, every answer that arrived is kept
        try:
            with relaxed_gc():
                report = session.drive_unit(
                    unit, rows_of(snapshot, unit) if unit.kind == "shard" else None
                )
        except UnitFailed as exc:  # for good: its reason is the unit's, in the run's status
            store.mark_unit_failed(unit.unit_id, str(exc))
            raise
    store.mark_unit_done(
        unit.unit_id,
        {
            "kind": unit.kind,
            "samples": report.samples,
            "skipped": report.skipped,
            "restarts": report.restarts,
            "seconds": round(time.perf_counter() - started, 3),
            # the sidecar's refusals (its metrics are never scraped in a Pod)
            "budgetRefused": bridge.budget().get("refused") or {} if bridge is not None else {},
        },
    )
    return report
