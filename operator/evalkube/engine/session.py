"""What a runner's units share, set up once and closed in one order, on every path.

``evalkube run`` (:mod:`evalkube.local.engine`), its unit processes
(:mod:`evalkube.local.parallel`) and a work-unit pod's runner (:mod:`evalkube.engine.pod`)
each drive their units through one :class:`UnitSession`, whose :meth:`~UnitSession.drive_unit`
owns model access: a task whose grader has ``model_access: gateway`` gets the bridge's grader
endpoint, execution tokens and a unit budget of ``max_model_calls`` per execution x planned
executions; any other task gets no endpoint and a zero budget.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

from evalkube.engine.answers import AnswerLog
from evalkube.engine.candidates import CandidateSource, candidate_source
from evalkube.engine.driver import has_model_access
from evalkube.engine.grade_batch import run_aggregate
from evalkube.engine.guard import ErrorGuard
from evalkube.engine.loading import LoadedSuite
from evalkube.engine.plan import Unit
from evalkube.engine.runner import observe_into, run_shard
from evalkube.engine.runtime import TaskRuntime, task_criteria
from evalkube.engine.task_sandbox import TaskModelSandboxes
from evalkube.engine.unit_context import (
    BridgeControl,
    NoProgress,
    Progress,
    UnitContext,
    UnitReport,
)
from evalkube.grading import TaskAggregate
from evalkube.models import EvalRunSpec
from evalkube.sandbox import SandboxBackend
from evalkube.store import ResultStore, SampleWriter
from evalkube.store.remote import RemoteStore


class UnitSession(ExitStack):
    """The sample writer, answer log, error guard, sandboxes and candidate sources of a run's
    units. Leaving it (an error, Ctrl-C or SIGTERM included) closes the sandboxes, keeps every
    model answer that arrived, commits what was graded, then calls ``close_bridge``.

    ``pod``: a work-unit pod's one unit, which waits for its own samples, starts and closes
    its own sandbox, leaves graders' calls to the sidecar and reads only its shard's rows.
    ``max_error_rate``: stop the run past it (:class:`~evalkube.engine.guard.ErrorGuard`)."""

    def __init__(
        self,
        run_id: str,
        loaded: LoadedSuite,
        spec: EvalRunSpec,
        store: ResultStore | RemoteStore,
        backend: SandboxBackend,
        runtimes: Mapping[str, TaskRuntime],
        *,
        resuming: bool,
        bridge: BridgeControl | None = None,
        close_bridge: Callable[[], None] | None = None,
        bridge_control: str | None = None,
        progress: Progress | None = None,
        max_error_rate: float | None = None,
        pod: bool = False,
    ) -> None:
        super().__init__()
        self.run_id, self.loaded, self.spec, self.store = run_id, loaded, spec, store
        self.backend, self.runtimes, self.resuming, self.pod = backend, runtimes, resuming, pod
        self.bridge, self.bridge_control = bridge, bridge_control
        self.progress = progress or NoProgress()
        self.guard = None if max_error_rate is None else ErrorGuard(max_error_rate)
        self.sources: dict[tuple[str, str], CandidateSource] = {}
        try:  # closed in the reverse order
            if close_bridge is not None:
                self.callback(close_bridge)
            self.writer = None if pod else SampleWriter(store)
            if self.writer is not None:
                self.callback(self.writer.close)  # what was graded before an interruption
            self.answers = AnswerLog(store, run_id, grader_calls=not pod)
            self.callback(self.answers.close)  # every model answer that arrived is kept
            if bridge is not None and hasattr(bridge, "keep_answers"):
                bridge.keep_answers(self.answers)  # graders' model calls too
            # One sandbox per task x model, shared by its shards only.
            self.sandboxes = TaskModelSandboxes()
            self.callback(self.sandboxes.close)
        except BaseException:
            self.close()
            raise

    def drive_unit(
        self,
        unit: Unit,
        rows: list[dict[str, Any]] | None,
        live: dict[tuple[str, str], TaskAggregate] | None = None,
    ) -> UnitReport:
        """Run ``unit`` (``rows``: its shard's dataset rows; ``None`` for an aggregate unit;
        ``live``: aggregates its samples are counted into as they are submitted)."""
        runtime = self.runtimes[unit.task_id]
        task, bridge = runtime.task, self.bridge
        access = bridge if bridge is not None and has_model_access(task) else None
        if bridge is not None:
            planned = len(rows or ()) * len(task.criteria) if unit.kind == "shard" else 1
            if access is not None:
                calls = max(g.max_model_calls for g in task.criteria)
                bridge.configure_unit(unit.unit_id, calls, planned)
            else:  # a grader without model access spends nothing, whatever it finds to call
                bridge.configure_unit(unit.unit_id, 0, 0)
        key = (unit.task_id, unit.model)
        if key not in self.sources:
            shard = (unit.start, unit.stop) if self.pod and unit.kind == "shard" else None
            self.sources[key] = candidate_source(
                unit.model, task, self.spec, self.loaded, self.bridge_control, shard
            )
        ctx = UnitContext(self.run_id, runtime, self.store, self.backend, self.sources[key])
        ctx.model_endpoint, ctx.bridge = (access.endpoint if access is not None else None), access
        ctx.progress, ctx.resuming, ctx.guard = self.progress, self.resuming, self.guard
        ctx.writer, ctx.answers = self.writer, self.answers
        if live is not None:
            criteria = {task.id: task_criteria(task)}
            ctx.observe = functools.partial(observe_into, live, criteria_of=criteria)
        if unit.kind == "aggregate":
            if self.writer is not None:
                self.writer.flush()  # grade_batch reads the task's samples back
            return run_aggregate(ctx, unit)
        if not self.pod:
            ctx.sandbox = self.sandboxes.get(ctx, unit)
        return run_shard(ctx, unit, rows or [])
