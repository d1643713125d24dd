"""Grading per sample: each criterion over the samples (a Python grader in the sandbox,
built-ins in process), the grader's answers validated before anything is recorded."""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from evalkube import limits
from evalkube.engine.judging import judge_samples
from evalkube.engine.prepare import Prepared
from evalkube.engine.runtime import task_criteria
from evalkube.engine.sample_buffer import SampleBuffer
from evalkube.engine.unit_context import UnitContext, execution_token
from evalkube.grading import (
    Criterion,
    EmbeddingJudge,
    GradeOutcome,
    ModelJudge,
    invalid,
    merge_outcomes,
    parse_output_json,
    validate_return,
)
from evalkube.models import GraderSpec
from evalkube.sandbox import Execution, GraderSandbox
from evalkube.store import SampleRecord


def execution_outcome(
    execution: Execution, metric_id: str, declared: Collection[str] = ()
) -> GradeOutcome:
    if execution.status == "returned":
        return validate_return(execution.value, metric_id, declared)
    error = execution.error or {}
    return invalid(
        metric_id,
        error_type=str(error.get("type") or execution.status),
        message=str(error.get("message") or execution.status),
        traceback=str(error.get("traceback") or ""),
        raw_repr=execution.value if isinstance(execution.value, str) else None,
    )


#: What an evalkube task's ``item`` adds to the row (docs/graders.md).
CONVENIENCE_KEYS = ("prompt", "target", "reference_answer", "choices", "task_id")


def _parsed_arguments(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls whose JSON ``arguments`` are parsed, for OpenAI's templates: they read
    ``{{ sample.output_tools[0].function.arguments.symbols }}`` (a Python grader gets the
    string, as the Chat Completions shape has it)."""
    out = []
    for call in tools:
        function = call.get("function")
        arguments = function.get("arguments") if isinstance(function, dict) else None
        parsed = parse_output_json(arguments) if isinstance(arguments, str) else None
        if isinstance(parsed, dict | list):
            call = {**call, "function": {**function, "arguments": parsed}}  # type: ignore[dict-item]
        out.append(call)
    return out


def grader_inputs(
    p: Prepared, openai: bool = False, templated: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(sample, item)`` as graders receive them (docs/graders.md).

    ``item`` is the row plus convenience fields; the row's own fields win (an OpenAI dataset's
    ``reference_answer`` column is the reference, whatever the target template says).
    ``openai`` (a task with ``graderInputs: openai``): OpenAI's namespaces instead, so an
    imported grader's ``item.get("reference_answer", item["answer"])`` falls back as it did;
    ``templated``: for a built-in criterion's templates (tool-call arguments parsed).
    """
    record = p.record
    if openai:
        sample = {
            "output_text": record.output_text,
            "output_tools": _parsed_arguments(p.output_tools) if templated else p.output_tools,
            "choices": p.sample_extra.get("choices")
            or [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": record.output_text},
                    "finish_reason": "stop",
                }
            ],
        }
        if "output_json" in p.sample_extra:
            sample["output_json"] = p.sample_extra["output_json"]
        return sample, dict(p.row)
    sample = {
        "output_text": record.output_text,
        "output_json": parse_output_json(record.output_text),
        "output_tools": p.output_tools,
        "extracted_output": record.extracted_output,
        "model": record.model,
        "prompt": record.prompt,
        "task_id": record.task_id,
        "run_id": record.run_id,
        "sample_id": record.sample_id,
    }
    item = {
        "prompt": record.prompt,
        "target": record.target,
        "reference_answer": record.target,
        "choices": p.choices,
        "task_id": record.task_id,
        **p.row,
    }
    return sample, item


def grade_samples(
    ctx: UnitContext, sandbox: GraderSandbox, ready: Iterator[Prepared], buffer: SampleBuffer
) -> None:
    """Grade each sample once per criterion; one Python grader streams, else they take turns."""
    runtime = ctx.runtime
    task = runtime.task
    fields = task.grader_fields()
    if len(fields) == 1 and not fields[0][1].builtin:
        program, spec = fields[0]
        for p, execution in _execute_criterion(ctx, sandbox, program, spec, ready, buffer):
            outcome = execution_outcome(execution, spec.metric_id, task.metrics or ())
            _record_outcome(p.record, execution, outcome)
            buffer.add(p.record)
        return
    # Several criteria share the candidates: the shard's samples are in memory already
    # (candidates are fetched per shard), so each criterion takes its turn over all of them.
    samples = list(ready)
    criteria = task_criteria(task)
    openai = task.grader_inputs == "openai"
    graded: dict[str, list[tuple[Criterion, GradeOutcome, Execution | None]]] = {
        p.sample_id: [] for p in samples
    }
    for (field_name, spec), criterion in zip(fields, criteria, strict=True):
        builtin = runtime.builtins.get(field_name)
        if builtin is None:
            for p, execution in _execute_criterion(
                ctx, sandbox, field_name, spec, iter(samples), buffer
            ):
                outcome = execution_outcome(execution, spec.metric_id, task.metrics or ())
                graded[p.sample_id].append((criterion, outcome, execution))
            continue
        inputs = [grader_inputs(p, openai, templated=True) for p in samples]
        if isinstance(builtin, ModelJudge | EmbeddingJudge):
            tokens = functools.partial(_open_tokens, ctx, buffer, samples)
            outcomes = judge_samples(builtin, inputs, ctx.model_endpoint, tokens)
        else:
            outcomes = [builtin.grade(sample, item) for sample, item in inputs]
        for p, outcome in zip(samples, outcomes, strict=True):
            graded[p.sample_id].append((criterion, outcome, None))
    for p in samples:
        results = graded[p.sample_id]
        record = p.record
        if len(results) == 1:  # one built-in criterion: stored as a single grader's
            _record_outcome(record, None, results[0][1])
        else:
            _record_outcome(record, None, merge_outcomes([(c, o) for c, o, _ in results]))
        executions = [(c.name, e) for c, _, e in results if e is not None]
        record.stdout = _labelled([(name, e.stdout) for name, e in executions])
        record.stderr = _labelled([(name, e.stderr) for name, e in executions])
        ms = [e.ms for _, e in executions if e.ms is not None]
        if ms:
            record.timings["grade_ms"] = round(sum(ms), 3)
        buffer.add(record)


def _open_tokens(
    ctx: UnitContext, buffer: SampleBuffer, samples: Sequence[Prepared], count: int
) -> list[str]:
    """Fresh execution tokens for a model criterion's calls, one per sample, opened on the
    bridge; their usage is taken with the samples' other usage when they are written."""
    tokens = [execution_token() for _ in range(count)]
    if ctx.bridge is not None:
        ctx.bridge.open_executions(tokens)
        for p, token in zip(samples, tokens, strict=True):
            buffer.tokens.setdefault(p.sample_id, []).append(token)
    return tokens


def _labelled(outputs: Sequence[tuple[str, str | None]]) -> str | None:
    """The criteria's prints, each under its name."""
    parts = [f"[{name}]\n{text}" for name, text in outputs if text]
    return "\n".join(parts) if parts else None


def _record_outcome(
    record: SampleRecord, execution: Execution | None, outcome: GradeOutcome
) -> None:
    record.status, record.scores, record.judge = outcome.status, outcome.scores, outcome.judge
    if outcome.error is not None:
        record.error = {"stage": "grading", **outcome.error}
    if execution is not None:
        record.stdout, record.stderr = execution.stdout, execution.stderr
        if execution.ms is not None:
            record.timings["grade_ms"] = execution.ms


def _execute_criterion(
    ctx: UnitContext,
    sandbox: GraderSandbox,
    program: str,
    spec: GraderSpec,
    ready: Iterator[Prepared],
    buffer: SampleBuffer,
) -> Iterator[tuple[Prepared, Execution]]:
    """``(sample, execution)`` of one criterion's grader over ``ready``, in order."""
    in_flight: deque[Prepared] = deque()
    bridge = ctx.bridge
    openai = ctx.runtime.task.grader_inputs == "openai"

    def tokened() -> Iterator[tuple[Prepared, str]]:
        """Samples with their execution ids: fresh tokens, opened a batch at a time, when
        the grader may call models; else the sample id (no bridge accepts it)."""
        if bridge is None:
            for p in ready:
                yield p, p.sample_id
            return
        while chunk := list(itertools.islice(ready, limits.WORKER_BATCH_SIZE)):
            tokens = [execution_token() for _ in chunk]
            if ctx.answers is not None:  # their answers are kept, and given back on resume
                samples = (p.sample_id for p in chunk)
                ctx.answers.label(dict(zip(tokens, samples, strict=True)), resuming=ctx.resuming)
            bridge.open_executions(tokens)
            for p, token in zip(chunk, tokens, strict=True):
                buffer.tokens.setdefault(p.sample_id, []).append(token)
                yield p, token

    def requests() -> Iterator[tuple[list[Any], str | None]]:
        for p, execution_id in tokened():
            sample, item = grader_inputs(p, openai)
            in_flight.append(p)
            yield [sample, item], execution_id

    for execution in sandbox.execute(program, requests(), timeout=float(spec.timeout_seconds)):
        yield in_flight.popleft(), execution
