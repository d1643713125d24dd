"""Reconcile decisions for an EvalRun, as pure functions of what was observed.

Inputs: the planned units, the Jobs that exist (by unit id) and the units whose runner
reported completion to the store. Output: which Jobs to create now, the phase, unit
counts and failures. Deterministic and idempotent: calling it again with the same
observations asks for nothing new, so an operator restarted at any moment resumes exactly.

Failure policy: a unit's Job retries through ``backoffLimit``; a Job that still fails, or
that completes without its runner reporting the unit done, makes the unit *failed*. The
other units go on; aggregate units of a task x model whose shards failed are not run. The
run ends ``Failed`` with a condition naming every failed unit and why, and with the results
of everything that did complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from evalkube import limits
from evalkube.controller import names
from evalkube.engine.plan import Unit
from evalkube.models.run import EvalRunStatus, UnitCounts
from evalkube.models.status import cap_message, condition, list_message, merge_conditions

JobPhase = Literal["active", "queued", "succeeded", "failed"]


@dataclass(frozen=True)
class JobState:
    """What the operator observed of one unit's Job."""

    phase: JobPhase
    reason: str = ""


JobIndex = Mapping[tuple[str, str], Iterable[tuple[str, JobState]]]
"""``(namespace, run) -> (unit id, state)`` of each work-unit Job (kopf's Job index)."""


@dataclass
class Decision:
    """What to do now and how the run stands."""

    create: list[Unit] = field(default_factory=list)
    phase: Literal["Running", "Succeeded", "Failed"] = "Running"
    total: int = 0
    done: int = 0
    active: int = 0
    """Units with an unfinished Job, ``queued`` ones included."""
    queued: int = 0
    """Units whose Job is suspended (waiting for Kueue to admit it)."""
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.phase != "Running"

    def counts(self) -> UnitCounts:
        return UnitCounts(
            total=self.total,
            succeeded=self.done,
            running=self.active,
            failed=len(self.failed),
            pending=self.total - self.done - self.active - len(self.failed),
            queued=self.queued,
        )


def decide(
    units: list[Unit],
    jobs: Mapping[str, JobState],
    done_units: set[str],
    parallelism: int,
    reported: Mapping[str, str] | None = None,
) -> Decision:
    """Decide which Jobs to create and whether the run is over (see module docstring).

    ``reported``: units whose runner reported them failed, with the reason (their Job may
    still be finishing); they are failed with that reason, whatever their Job says."""
    reported = reported or {}
    decision = Decision(total=len(units))
    failed_groups: set[tuple[str, str]] = set()
    pending_groups: set[tuple[str, str]] = set()
    waiting: list[Unit] = []
    for unit in units:
        group = (unit.task_id, unit.model)
        job = jobs.get(unit.unit_id)
        if unit.unit_id in done_units:
            decision.done += 1
            continue
        if unit.unit_id in reported:
            why = reported[unit.unit_id] or "the unit's runner gave up"
        elif job is not None and job.phase == "failed":
            why = job.reason or "the unit's Job failed"
        elif job is not None and job.phase == "succeeded":
            why = "the unit's Job completed but its runner never reported the unit done"
        else:
            if unit.kind == "shard":
                pending_groups.add(group)
            if job is None:
                waiting.append(unit)
            else:
                decision.active += 1
                decision.queued += job.phase == "queued"
            continue
        decision.failed[unit.unit_id] = why
        failed_groups.add(group)
    for unit in waiting:
        group = (unit.task_id, unit.model)
        if unit.kind == "aggregate" and group in failed_groups:
            decision.failed[unit.unit_id] = "not run: shard units of this task and model failed"
        elif unit.kind != "aggregate" or group not in pending_groups:
            decision.create.append(unit)
    del decision.create[max(0, parallelism - decision.active) :]  # the room left
    if decision.done + len(decision.failed) == decision.total:
        decision.phase = "Failed" if decision.failed else "Succeeded"
    return decision


def job_state(job: Mapping[str, Any]) -> JobState:
    """Read a Job's state from its status conditions; an unfinished Job that is suspended
    (created so for Kueue, not admitted yet, or preempted) is ``queued``."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return JobState("succeeded")
        if cond.get("type") == "Failed":
            why = f"{cond.get('reason', '')}: {cond.get('message', '')}"
            return JobState("failed", why.strip(": "))
    return JobState("queued" if (job.get("spec") or {}).get("suspend") else "active")


def job_index_entry(
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    job: Mapping[str, Any],
) -> dict[tuple[str, str], tuple[str, JobState]]:
    """A work-unit Job's entry in the Job index (none for a Job without its unit id)."""
    unit = annotations.get(names.ANNOTATION_UNIT_ID)
    run = annotations.get(names.ANNOTATION_RUN) or labels.get(names.LABEL_RUN)
    return {(namespace, run): (unit, job_state(job))} if unit and run else {}


def failed_units_message(failed: Mapping[str, str], total: int, run: str, chars: int) -> str:
    """``N of M units failed: unit ID: why; ...`` in at most ``chars`` characters: each reason
    at most :data:`~evalkube.limits.FAILED_UNIT_REASON_CHARS`, the units that fit in id order,
    then how many more failed and where to see them."""
    items = [
        f"unit {unit}: {cap_message(why, limits.FAILED_UNIT_REASON_CHARS)}"
        for unit, why in sorted(failed.items())
    ]
    more = f" (their Jobs: kubectl get jobs -l {names.LABEL_RUN}={run})"
    return list_message(f"{len(failed)} of {total} units failed", items, chars, more)


def summary_line(metrics: Mapping[str, Mapping[str, float]]) -> str:
    """A short printer-column summary: the mean of each task's first metric."""
    firsts = [next(iter(m.values())) for m in metrics.values() if m]
    if not firsts:
        return "-"
    return f"{sum(firsts) / len(firsts):.3f} mean of {len(firsts)}"


def permanent_refusal(exc: Exception) -> bool:
    """Whether the API server refused a status patch for what it holds, not for a while: too
    large (``413``, or a ``500`` saying so, as etcd's size limit comes back) or invalid
    (``422``)."""
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    message = str(getattr(status, "message", "") or "").lower()
    return code in (413, 422) or (code == 500 and ("too large" in message or "limit" in message))


def refused_status(new: EvalRunStatus, exc: Exception, generation: int | None) -> EvalRunStatus:
    """The status of a finished run whose status the API server refused: ``Failed``, with the
    refusal named and the results left out (they stay in the store)."""
    status = getattr(exc, "status", None)
    code = getattr(status, "code", "?")
    refusal = str(getattr(status, "message", "") or exc)[:500]
    message = (
        f"the API server refused this run's status (HTTP {code}: {refusal}); its "
        f"{len(new.results)} results are in the store: `evalkube samples` and "
        "`evalkube report` with --api show them"
    )
    conditions = [
        condition(kind, False, "StatusRejected", message, generation)
        for kind in ("Ready", "Succeeded")
    ]
    return new.model_copy(
        update={
            "phase": "Failed",
            "results": [],
            "summary": None,
            "gate": None,
            "conditions": merge_conditions(new.conditions, conditions, keep_others=True),
        }
    )
