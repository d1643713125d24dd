"""``grade_batch``: one call over a task x model's stored samples, whose metrics and
per-sample updates are validated and applied."""

from __future__ import annotations

import time
from typing import Any

from evalkube import limits
from evalkube.engine.grade import execution_outcome
from evalkube.engine.plan import Unit
from evalkube.engine.sample_buffer import record_bytes
from evalkube.engine.task_sandbox import sandbox_environment, started
from evalkube.engine.unit_context import UnitContext, UnitFailed, UnitReport, execution_token
from evalkube.grading import validate_batch_return
from evalkube.sandbox import GraderSandbox
from evalkube.store import SampleRecord, TaskResultRecord
from evalkube.util import jsonfast


def batch_sample(record: SampleRecord) -> dict[str, Any]:
    """The shape ``grade_batch`` receives for one sample (docs/graders.md)."""
    return {
        "sample_id": record.sample_id,
        "task_id": record.task_id,
        "model": record.model,
        "prompt": record.prompt,
        "target": record.target,
        "output_text": record.output_text,
        "extracted_output": record.extracted_output,
        "dataset_row": record.dataset_row,
        "response_id": record.response_id,
        "scores": record.scores,
        "judge": record.judge,
    }


def batch_records(ctx: UnitContext, unit: Unit) -> list[SampleRecord]:
    """The task x model's samples for ``grade_batch``, read until they pass
    :data:`limits.BATCH_SAMPLES_MAX` or :data:`limits.BATCH_SAMPLES_BYTES`: then
    :class:`UnitFailed`, naming the task and what to do, before the runner runs out of memory."""
    records: list[SampleRecord] = []
    size = 0
    samples = ctx.store.iter_samples(ctx.run_id, task_id=unit.task_id, model=unit.model)
    try:
        for record in samples:
            records.append(record)
            size += record_bytes(record) + len(jsonfast.dumps(record.dataset_row))
            if len(records) > limits.BATCH_SAMPLES_MAX or size > limits.BATCH_SAMPLES_BYTES:
                raise UnitFailed(batch_too_large(unit, len(records), size))
    finally:
        getattr(samples, "close", lambda: None)()  # the store's cursor, or the HTTP stream
    return records


def batch_too_large(unit: Unit, samples: int, size: int) -> str:
    return (
        f"task {unit.task_id!r}, model {unit.model!r}: grade_batch gets every sample of the "
        f"task and model at once, and they pass its limit of "
        f"{limits.BATCH_SAMPLES_MAX:,} samples or {limits.BATCH_SAMPLES_BYTES // 2**20} MiB "
        f"(read so far: {samples:,} samples, {size / 2**20:.1f} MiB); split the task's dataset "
        "into several tasks (each gets its own grade_batch), or grade it per sample "
        "(contract: sample) and compute corpus metrics from `evalkube samples --format jsonl`"
    )


def run_aggregate(ctx: UnitContext, unit: Unit) -> UnitReport:
    """Run ``grade_batch`` once over the task x model's samples; apply metrics and updates."""
    began = time.perf_counter()
    runtime = ctx.runtime
    task = runtime.task
    grader_spec = task.primary_grader
    records = batch_records(ctx, unit)
    ctx.progress.unit_started(unit, len(records))
    by_id = {r.sample_id: r for r in records}
    report = UnitReport(unit, samples=len(records))
    sandbox = started(
        GraderSandbox(
            ctx.backend,
            [runtime.grader],
            task_id=task.id,
            model_endpoint=ctx.model_endpoint,
            load_timeout=float(grader_spec.timeout_seconds),
            isolation=grader_spec.resolved_isolation,
            environment=sandbox_environment(ctx.backend, runtime),
        ),
        runtime,
    )
    token = unit.unit_id
    batch_calls: dict[str, int] = {}
    if ctx.bridge is not None:
        token = execution_token()
        ctx.bridge.open_executions([token])
    try:
        requests = [([[batch_sample(r) for r in records]], token)]
        timeout = float(grader_spec.timeout_seconds)
        execution = next(iter(sandbox.execute(runtime.grader.name, requests, timeout=timeout)))
    finally:
        if ctx.bridge is not None:
            usage = ctx.bridge.take_usage([token]).get(token) or {}
            batch_calls = {k: int(v) for k, v in (usage.get("by_purpose") or {}).items()}
            if usage.get("retries"):
                batch_calls["retries"] = int(usage["retries"])
        report.restarts = sandbox.restarts
        sandbox.close()
    metric_id = grader_spec.metric_id
    if execution.status != "returned":
        failed = execution_outcome(execution, metric_id)
        _fail_batch(ctx, unit, failed.error or {}, metric_id, batch_calls)
    else:
        outcome = validate_batch_return(
            execution.value, declared_metrics=task.metrics, sample_ids=by_id.keys()
        )
        if outcome.error is not None:
            _fail_batch(ctx, unit, outcome.error, metric_id, batch_calls)
        else:
            updates = []
            for update in outcome.updates:
                record = by_id[update.sample_id]
                values: dict[str, Any] = {"sample_id": update.sample_id}
                if update.scores:
                    # keep the merge on the record: a later update of the same sample in
                    # this return merges into it instead of replacing it
                    record.scores = {**record.scores, **update.scores}
                    values["scores"] = record.scores
                if update.sets_judge:
                    values["judge"] = update.judge
                if update.sets_extracted_output:
                    values["extracted_output"] = update.extracted_output
                if len(values) > 1:
                    updates.append(values)
            ctx.store.apply_sample_updates(ctx.run_id, updates)
            ctx.store.settle_pending(ctx.run_id, unit.task_id, unit.model, "valid")
            problems = list(outcome.problems)
            if outcome.dropped_metrics:
                problems.append(
                    f"undeclared batch metrics dropped: {sorted(outcome.dropped_metrics)}"
                )
            ctx.store.save_task_result(
                TaskResultRecord(
                    ctx.run_id,
                    unit.task_id,
                    unit.model,
                    outcome.metrics,
                    None,
                    problems,
                    batch_calls,
                )
            )
    ctx.progress.advance(unit, len(records))
    report.seconds = time.perf_counter() - began
    return report


def _fail_batch(
    ctx: UnitContext,
    unit: Unit,
    error: dict[str, Any],
    metric_id: str,
    model_calls: dict[str, int],
) -> None:
    raw = error.get("invalid_payload")
    error = {"stage": "batch", **{k: v for k, v in error.items() if k != "invalid_payload"}}
    judge = {"invalid_payload": raw, "error": error}
    ctx.store.settle_pending(
        ctx.run_id,
        unit.task_id,
        unit.model,
        "invalid",
        {"scores": {metric_id: 0.0}, "error": error, "judge": judge},
    )
    ctx.store.save_task_result(
        TaskResultRecord(
            ctx.run_id,
            unit.task_id,
            unit.model,
            {},
            f"{error.get('type')}: {error.get('message')}",
            [],
            model_calls,
        )
    )
