"""A shard's rows made ready to grade: through the task's preprocessor (each numbered and
given its sample id), the prompt, the model's answer (a kept one first, on resume) and the
extraction. A row that fails a stage is recorded as errored there."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkube.engine.candidates import Candidate
from evalkube.engine.plan import SEQ_STRIDE, Unit, sample_id
from evalkube.engine.runtime import TaskRuntime
from evalkube.engine.sample_buffer import SampleBuffer
from evalkube.engine.unit_context import UnitContext, stage_error
from evalkube.grading import ExtractionMiss, TemplateError, apply_stop, capped_repr
from evalkube.sandbox import Execution, GraderSandbox
from evalkube.store import SampleRecord


@dataclass(slots=True)
class Prepared:
    seq: int
    sample_id: str
    row: dict[str, Any]
    row_id: str
    record: SampleRecord
    choices: list[str] = field(default_factory=list)
    output_tools: list[dict[str, Any]] = field(default_factory=list)
    sample_extra: dict[str, Any] = field(default_factory=dict)


def _base_record(
    ctx: UnitContext, unit: Unit, seq: int, row: dict[str, Any], row_id: str
) -> SampleRecord:
    # positional: built for every sample (run_id, sample_id, task_id, model, seq, status, row_id)
    return SampleRecord(
        ctx.run_id,
        sample_id(ctx.run_id, unit.task_id, unit.model, seq),
        unit.task_id,
        unit.model,
        seq,
        "valid",
        row_id,
        dataset_row=row,
    )


def _row_id(runtime: TaskRuntime, row: dict[str, Any], fallback: int | str) -> str:
    id_field = runtime.task.dataset.id_field
    if id_field and row.get(id_field) is not None:
        return str(row[id_field])
    return str(fallback)


def preprocess(
    ctx: UnitContext,
    sandbox: GraderSandbox,
    unit: Unit,
    rows: list[dict[str, Any]],
    buffer: SampleBuffer,
) -> list[Prepared]:
    """Rows after the preprocessor, each with its sequence number and sample id."""
    runtime = ctx.runtime
    base = unit.shard * SEQ_STRIDE
    spec = runtime.task.preprocess
    out: list[Prepared] = []

    def keep(position: int, row: dict[str, Any], row_id: str) -> None:
        record = _base_record(ctx, unit, base + position, row, row_id)
        out.append(Prepared(record.seq, record.sample_id, row, row_id, record))

    def fail(position: int, row: dict[str, Any], row_id: str, error: dict[str, Any]) -> None:
        record = _base_record(ctx, unit, base + position, row, row_id)
        record.status, record.error = "errored", error
        buffer.add(record)

    if spec is None:
        for position, row in enumerate(rows):
            keep(position, row, _row_id(runtime, row, unit.start + position))
        return out
    timeout = float(spec.timeout_seconds)
    if spec.contract == "sample":
        executions = sandbox.execute("preprocess", (([row], None) for row in rows), timeout=timeout)
        for position, (row, execution) in enumerate(zip(rows, executions, strict=True)):
            row_id = _row_id(runtime, row, unit.start + position)
            if execution.status == "returned" and isinstance(execution.value, dict):
                keep(position, execution.value, _row_id(runtime, execution.value, row_id))
            else:
                error = _preprocess_error(execution, "transform", "a dict (the row)")
                fail(position, row, row_id, error)
        return out
    execution = next(iter(sandbox.execute("preprocess", [([rows], None)], timeout=timeout)))
    value = execution.value
    if (
        execution.status == "returned"
        and isinstance(value, list)
        and all(isinstance(r, dict) for r in value)
    ):
        for position, row in enumerate(value):
            keep(position, row, _row_id(runtime, row, f"{unit.shard}:{position}"))
        return out
    error = _preprocess_error(execution, "transform_batch", "a list of dicts (the rows)")
    for position, row in enumerate(rows):
        fail(position, row, _row_id(runtime, row, unit.start + position), error)
    return out


def _preprocess_error(execution: Execution, function: str, expected: str) -> dict[str, Any]:
    if execution.status == "returned":
        return stage_error(
            "preprocess",
            "InvalidPreprocessResult",
            f"{function} returned {capped_repr(execution.value, 200)}; it must return {expected}",
        )
    error = execution.error or {}
    return stage_error(
        "preprocess",
        str(error.get("type", execution.status)),
        str(error.get("message", "")),
        str(error.get("traceback", "")),
    )


def generate(
    ctx: UnitContext, unit: Unit, prepared: list[Prepared], buffer: SampleBuffer
) -> Iterator[Prepared]:
    """Render, fetch candidates and extract; errored samples go to the buffer."""
    runtime = ctx.runtime
    rendered: list[Prepared] = []
    for p in prepared:
        try:
            prompt, target = runtime.template.render(p.row, runtime.context)
        except TemplateError as exc:
            p.record.status = "errored"
            p.record.error = stage_error("render", "TemplateError", str(exc))
            buffer.add(p.record)
            continue
        p.record.prompt, p.record.target = prompt, target
        p.choices = runtime.choices(p.row)
        rendered.append(p)
    candidates = _fetch(ctx, unit, rendered)
    stop = runtime.task.stop
    for p, candidate in zip(rendered, candidates, strict=True):
        if _apply_candidate(runtime, p, candidate, stop):
            yield p
        else:
            buffer.add(p.record)


def _fetch(ctx: UnitContext, unit: Unit, rendered: list[Prepared]) -> list[Candidate]:
    """Candidates of ``rendered``: answers kept by an earlier attempt of the run, then the
    source's, each kept and counted the moment it arrives."""
    assert ctx.source is not None
    answers, guard, progress = ctx.answers, ctx.guard, ctx.progress
    kept = answers.kept([p.sample_id for p in rendered]) if answers and ctx.resuming else {}
    if kept:
        progress.generated(unit, len(kept))
    todo = [p for p in rendered if p.sample_id not in kept]

    def arrived(position: int, candidate: Candidate) -> None:
        if answers is not None:
            answers.add(todo[position].sample_id, candidate)
        progress.generated(unit, 1)
        if guard is not None and candidate.model_calls:
            guard.count("model calls", unit.task_id, unit.model, candidate.error)

    fresh = ctx.source.candidates(
        [p.row for p in todo], [p.row_id for p in todo], [p.record.prompt for p in todo], arrived
    )
    if not kept:
        return fresh
    by_id = {p.sample_id: c for p, c in zip(todo, fresh, strict=True)} | kept
    return [by_id[p.sample_id] for p in rendered]


def _apply_candidate(
    runtime: TaskRuntime, p: Prepared, candidate: Candidate, stop: Sequence[str]
) -> bool:
    record = p.record
    record.response_id = candidate.response_id
    if candidate.model_calls:
        record.model_calls = dict(candidate.model_calls)
    if candidate.ms is not None:
        record.timings["generation_ms"] = candidate.ms
    if candidate.error is not None:
        record.status = "errored"
        record.error = stage_error("generation", "GenerationError", candidate.error)
        return False
    p.output_tools = candidate.output_tools
    p.sample_extra = candidate.sample_extra
    text = candidate.output_text or ""
    record.output_text = apply_stop(text, stop) if stop else text
    if candidate.extracted_given or candidate.extracted_output is not None:
        record.extracted_output = candidate.extracted_output  # None: no parsed answer
        return True
    try:
        record.extracted_output = runtime.extractor.extract(record.output_text, p.choices)
    except ExtractionMiss as exc:
        record.status = "errored"
        record.error = stage_error("extraction", "ExtractionMiss", str(exc))
        return False
    return True
