"""Run one unit: rows -> preprocess -> prompt -> candidate -> extraction -> grade -> store.

The unit runner is the trusted side of the sandbox: the worker's answers are untrusted data,
validated here by :mod:`evalkube.grading` before anything is recorded. Every row ends as a
stored sample (valid, invalid, errored, or pending for ``grade_batch``) before the unit
counts as done. The same function runs inside a work-unit pod and in ``evalkube run``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from evalkube.engine.grade import grade_samples
from evalkube.engine.plan import Unit, seq_range
from evalkube.engine.prepare import generate, preprocess
from evalkube.engine.sample_buffer import SampleBuffer
from evalkube.engine.task_sandbox import task_sandbox
from evalkube.engine.unit_context import UnitContext, UnitReport
from evalkube.grading import Criterion, TaskAggregate
from evalkube.store import SampleRecord


def run_shard(ctx: UnitContext, unit: Unit, rows: list[dict[str, Any]]) -> UnitReport:
    """Run one shard unit over ``rows`` (the dataset rows of this shard, unprocessed)."""
    started = time.perf_counter()
    runtime = ctx.runtime
    report = UnitReport(unit)
    buffer = SampleBuffer(ctx, unit)
    shared = ctx.sandbox is not None
    sandbox = ctx.sandbox if ctx.sandbox is not None else task_sandbox(ctx)
    restarts_before = sandbox.restarts
    try:
        prepared = preprocess(ctx, sandbox, unit, rows, buffer)
        if ctx.resuming:
            # this shard's ids only: a retried pod's download does not grow with the shards
            seqs = seq_range(unit)
            done = ctx.store.recorded_sample_ids(ctx.run_id, unit.task_id, unit.model, seqs)
            if ctx.answers is not None:  # failed model calls are made again
                done -= ctx.answers.retry_ids(unit.task_id, unit.model, seqs)
            report.skipped = sum(1 for p in prepared if p.sample_id in done)
            prepared = [p for p in prepared if p.sample_id not in done]
        ctx.progress.unit_started(unit, len(prepared) + buffer.written + len(buffer.records))
        ready = generate(ctx, unit, prepared, buffer)
        if runtime.task.primary_grader.resolved_execution == "aggregate":
            for p in ready:
                p.record.status = "pending"
                buffer.add(p.record)
        else:
            grade_samples(ctx, sandbox, ready, buffer)
    finally:
        try:
            buffer.close()
        finally:
            report.restarts = sandbox.restarts - restarts_before
            if not shared:
                sandbox.close()
    report.samples = buffer.written
    report.seconds = time.perf_counter() - started
    return report


def observe_into(
    live: dict[tuple[str, str], TaskAggregate],
    records: list[SampleRecord],
    criteria_of: Mapping[str, Sequence[Criterion]] | None = None,
) -> None:
    """Count ``records`` into per task x model aggregates (``add`` skips response ids);
    ``criteria_of`` (task id -> criteria) adds the pass/fail counts."""
    for key, group in itertools.groupby(records, key=lambda r: (r.task_id, r.model)):
        add = live.setdefault(key, TaskAggregate()).add
        criteria = (criteria_of or {}).get(key[0], ())
        for record in group:
            add(record.status, record.scores, record.model_calls, criteria)
