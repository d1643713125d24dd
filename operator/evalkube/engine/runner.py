"""Run one unit: rows -> preprocess -> prompt -> candidate -> extraction -> grade -> store.

The unit runner is the trusted side of the sandbox: the worker's answers are untrusted data,
validated here by :mod:`evalkube.grading` before anything is recorded. Every row ends as a
stored sample (valid, invalid, errored, or pending for ``grade_batch``) before the unit
counts as done. The same function runs inside a work-unit pod and in ``evalkube run``.
"""

from __future__ import annotations

import functools
import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from evalkube import limits
from evalkube.engine.candidates import Candidate, CandidateSource
from evalkube.engine.judging import judge_samples
from evalkube.engine.plan import SEQ_STRIDE, Unit, sample_id, seq_range
from evalkube.engine.runtime import TaskRuntime, task_criteria
from evalkube.grading import (
    Criterion,
    EmbeddingJudge,
    ExtractionMiss,
    GradeOutcome,
    ModelJudge,
    TaskAggregate,
    TemplateError,
    apply_stop,
    capped_repr,
    invalid,
    merge_outcomes,
    parse_output_json,
    validate_batch_return,
    validate_return,
)
from evalkube.models import GraderSpec, TaskSpec
from evalkube.sandbox import Execution, GraderSandbox, ProgramLoadError, SandboxBackend
from evalkube.sandbox.environment import EnvironmentProblem, LocalEnvironment, resolve_local
from evalkube.store import SampleRecord, SampleWriter, TaskResultRecord
from evalkube.store.protocol import SampleStore
from evalkube.util import jsonfast

if TYPE_CHECKING:
    from evalkube.engine.answers import AnswerLog
    from evalkube.engine.guard import ErrorGuard


class BridgeControl(Protocol):
    """The runner's handle on a model bridge (in-process, child process or pod sidecar)."""

    @property
    def endpoint(self) -> str | None:
        """Where graders reach the bridge (``unix:/path`` or ``http://host:port``)."""

    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int
    ) -> None:
        """Serve ``unit_id`` with fresh counters (closing every open execution token)."""

    def open_executions(self, tokens: Iterable[str]) -> None:
        """Let graders call models with ``tokens`` until their usage is taken."""

    def take_usage(self, execution_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids``, closing those tokens."""

    def budget(self) -> dict[str, object]:
        """The served unit's budget, use and refusals by scope (``refused``)."""


def execution_token() -> str:
    """A fresh, unguessable execution token (128 bits): the only id a grader's model calls
    are charged to, so a grader can neither guess nor forge another execution's."""
    return secrets.token_urlsafe(16)


class Progress(Protocol):
    """What a unit reports while it runs (the CLI draws progress bars from it)."""

    def planned(self, units: Sequence[Unit]) -> None:
        """The units a run is about to run (shard units sized by their rows)."""

    def unit_started(self, unit: Unit, total: int) -> None:
        """``unit`` has ``total`` samples to record (its exact size)."""

    def advance(self, unit: Unit, samples: int) -> None:
        """``samples`` more of ``unit`` are graded and recorded."""

    def generated(self, unit: Unit, answers: int) -> None:
        """``answers`` more model answers of ``unit`` arrived (or were kept from before)."""


class NoProgress:
    def planned(self, units: Sequence[Unit]) -> None:
        pass

    def unit_started(self, unit: Unit, total: int) -> None:
        pass

    def advance(self, unit: Unit, samples: int) -> None:
        pass

    def generated(self, unit: Unit, answers: int) -> None:
        pass


@dataclass
class UnitContext:
    """Everything a unit needs from its run."""

    run_id: str
    runtime: TaskRuntime
    store: SampleStore
    backend: SandboxBackend
    source: CandidateSource | None = None
    model_endpoint: str | None = None
    bridge: BridgeControl | None = None
    """The model bridge of a task with model access (set by
    :class:`~evalkube.engine.session.UnitSession`): executions get tokens, samples their usage."""
    progress: Progress = field(default_factory=NoProgress)
    observe: Callable[[list[SampleRecord]], None] | None = None
    """Sees every chunk of records as it is submitted (live aggregates of a local run)."""
    resuming: bool = False
    writer: SampleWriter | None = None
    """A writer that units share (a local run); the unit then only submits its samples and
    whoever marks it done queues that behind them. ``None``: each unit waits for its own."""
    sandbox: GraderSandbox | None = None
    """A started sandbox of this task x model that its shard units share (a local run's
    :class:`TaskModelSandboxes`). ``None``: each shard starts and closes its own."""
    answers: AnswerLog | None = None
    """Keeps every model answer as it arrives and gives kept ones back on resume (a local
    run). ``None``: candidates live only until their sample is recorded."""
    guard: ErrorGuard | None = None
    """Stops the run when a task x model fails past the maximum error rate."""


@dataclass
class UnitReport:
    """What one unit did."""

    unit: Unit
    samples: int = 0
    skipped: int = 0
    restarts: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class _Prepared:
    seq: int
    sample_id: str
    row: dict[str, Any]
    row_id: str
    record: SampleRecord
    choices: list[str] = field(default_factory=list)
    output_tools: list[dict[str, Any]] = field(default_factory=list)
    sample_extra: dict[str, Any] = field(default_factory=dict)


class UnitFailed(RuntimeError):
    """A unit could not run at all (its programs do not load); nothing partial is recorded."""


def _error(stage: str, kind: str, message: str, traceback: str = "") -> dict[str, Any]:
    return {"stage": stage, "type": kind, "message": message, "traceback": traceback}


def _outcome(execution: Execution, metric_id: str, declared: Collection[str] = ()) -> GradeOutcome:
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


def record_bytes(record: SampleRecord) -> int:
    """About how many bytes ``record`` takes once encoded for the store: its texts and its
    judge (up to :data:`limits.RESULT_PAYLOAD_BYTES` each), the part a grader controls."""
    size = 512
    for text in (record.output_text, record.extracted_output, record.target, record.stdout):
        size += len(text) if text else 0
    size += len(record.stderr) if record.stderr else 0
    for value in (record.judge, record.error, record.prompt, record.dataset_row):
        if value is not None:
            size += len(value) if isinstance(value, str) else len(jsonfast.dumps(value))
    return size


class _Buffer:
    """Collects records and hands them to the store in chunks (on a writer thread)."""

    def __init__(self, ctx: UnitContext, unit: Unit) -> None:
        self.ctx, self.unit = ctx, unit
        self.records: list[SampleRecord] = []
        #: Estimated bytes of :attr:`records` (flushed at :data:`limits.STORE_CHUNK_BYTES`).
        self.bytes = 0
        self.written = 0
        self.shared = ctx.writer is not None
        self.writer = ctx.writer if ctx.writer is not None else SampleWriter(ctx.store)
        #: The execution tokens (one per criterion) of each graded sample whose usage is
        #: not taken yet.
        self.tokens: dict[str, list[str]] = {}

    def add(self, record: SampleRecord) -> None:
        guard = self.ctx.guard
        if guard is not None:
            error = record.error if record.status in ("errored", "invalid") else None
            guard.count(
                "samples",
                record.task_id,
                record.model,
                None if error is None else f"{error.get('type')}: {error.get('message')}",
            )
        self.records.append(record)
        self.bytes += record_bytes(record)
        if len(self.records) >= limits.STORE_CHUNK_SIZE or self.bytes >= limits.STORE_CHUNK_BYTES:
            self.submit()

    def submit(self) -> None:
        if not self.records:
            return
        if self.ctx.bridge is not None:
            self._attach_usage()
        self.writer.submit(self.records)
        if self.ctx.observe is not None:
            self.ctx.observe(self.records)
        self.ctx.progress.advance(self.unit, len(self.records))
        self.written += len(self.records)
        for record in self.records:
            # encoded for the store already; the shard's samples stay listed until the unit
            # ends, so a judge of up to 1 MB each would otherwise stay in memory with them
            record.judge = None
        self.records = []
        self.bytes = 0

    def close(self) -> None:
        """Submit what is left; with its own writer, wait until every sample is committed."""
        if self.shared:
            self.submit()
            return
        try:
            self.submit()
        finally:
            self.writer.close()

    def _attach_usage(self) -> None:
        assert self.ctx.bridge is not None
        tokens = self.tokens
        owned = [(r, tokens.pop(r.sample_id)) for r in self.records if r.sample_id in tokens]
        if not owned:
            return
        opened = [token for _, ts in owned for token in ts]
        usage = self.ctx.bridge.take_usage(opened)
        if self.ctx.answers is not None:
            self.ctx.answers.unlabel(opened)
        for record, ts in owned:
            for token in ts:
                self._merge_usage(record, usage.get(token))

    @staticmethod
    def _merge_usage(record: SampleRecord, calls: dict[str, Any] | None) -> None:
        if not calls:
            return
        merged = dict(record.model_calls)
        for purpose, count in (calls.get("by_purpose") or {}).items():
            merged[purpose] = merged.get(purpose, 0) + int(count)
        retries = int(calls.get("retries") or 0)  # sent again, maybe billed: counted
        if retries:
            merged["retries"] = merged.get("retries", 0) + retries
        ids = list(merged.get("response_ids", [])) + list(calls.get("response_ids") or [])
        if ids:
            merged["response_ids"] = ids
        record.model_calls = merged


def run_shard(ctx: UnitContext, unit: Unit, rows: list[dict[str, Any]]) -> UnitReport:
    """Run one shard unit over ``rows`` (the dataset rows of this shard, unprocessed)."""
    started = time.perf_counter()
    runtime = ctx.runtime
    report = UnitReport(unit)
    buffer = _Buffer(ctx, unit)
    shared = ctx.sandbox is not None
    sandbox = ctx.sandbox if ctx.sandbox is not None else task_sandbox(ctx)
    restarts_before = sandbox.restarts
    try:
        prepared = _preprocess(ctx, sandbox, unit, rows, buffer)
        if ctx.resuming:
            # this shard's ids only: a retried pod's download does not grow with the shards
            seqs = seq_range(unit)
            done = ctx.store.recorded_sample_ids(ctx.run_id, unit.task_id, unit.model, seqs)
            if ctx.answers is not None:  # failed model calls are made again
                done -= ctx.answers.retry_ids(unit.task_id, unit.model, seqs)
            report.skipped = sum(1 for p in prepared if p.sample_id in done)
            prepared = [p for p in prepared if p.sample_id not in done]
        ctx.progress.unit_started(unit, len(prepared) + buffer.written + len(buffer.records))
        ready = _candidates(ctx, unit, prepared, buffer)
        if runtime.task.primary_grader.resolved_execution == "aggregate":
            for p in ready:
                p.record.status = "pending"
                buffer.add(p.record)
        else:
            _grade_samples(ctx, sandbox, ready, buffer)
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


def task_sandbox(ctx: UnitContext) -> GraderSandbox:
    """Start a sandbox with the task's programs; :class:`UnitFailed` when they do not load."""
    return _start_sandbox(ctx.backend, ctx.runtime, ctx.model_endpoint)


def sandbox_environment(backend: SandboxBackend, runtime: TaskRuntime) -> LocalEnvironment | None:
    """What a local sandbox mounts for the task's ``grader.environment`` (``None``: the
    managed grader environment, or a pod's grader container, whose image holds its own)."""
    if not backend.mounts_environment:
        return None
    if runtime.environment is not None:
        return runtime.environment
    programs = runtime.task.grader_programs()
    if not programs:
        return None  # built-in criteria only: no grader code to give packages to
    kind, spec = programs[0]
    try:
        return resolve_local(spec.environment, field=f"tasks[{runtime.task.id}].{kind}.environment")
    except EnvironmentProblem as exc:
        raise UnitFailed(str(exc)) from None


def grader_calls_models(task: TaskSpec) -> bool:
    """Whether a sandboxed (Python) grader of ``task`` may call models through ``ctx``. Only
    then does its sandbox get the bridge's endpoint (a pod's grader container, the socket):
    a Python grader beside a ``score_model`` criterion does not share the runner's access."""
    return any(g.resolved_model_access == "gateway" for _, g in task.grader_programs())


def _start_sandbox(
    backend: SandboxBackend, runtime: TaskRuntime, model_endpoint: str | None
) -> GraderSandbox:
    if not grader_calls_models(runtime.task):
        model_endpoint = None
    sandbox = GraderSandbox(
        backend,
        runtime.programs,
        task_id=runtime.task.id,
        model_endpoint=model_endpoint,
        load_timeout=float(max(g.timeout_seconds for g in runtime.task.criteria)),
        batch_size=limits.WORKER_BATCH_SIZE_MODEL_ACCESS
        if model_endpoint
        else limits.WORKER_BATCH_SIZE,
        isolation="sample"
        if any(g.resolved_isolation == "sample" for g in runtime.task.criteria)
        else "unit",
        environment=sandbox_environment(backend, runtime),
    )
    try:
        sandbox.start()
    except ProgramLoadError as exc:
        raise UnitFailed(program_load_message(runtime, exc)) from None
    return sandbox


def observe_into(
    live: dict[tuple[str, str], TaskAggregate],
    records: list[SampleRecord],
    criteria_of: Mapping[str, Sequence[Criterion]] | None = None,
) -> None:
    """Count ``records`` into per task x model aggregates (``add`` skips response ids);
    ``criteria_of`` (task id -> criteria) adds the pass/fail counts."""
    for key, group in itertools.groupby(records, key=lambda r: (r.task_id, r.model)):
        aggregate = live.get(key)
        if aggregate is None:
            aggregate = live[key] = TaskAggregate()
        add = aggregate.add
        criteria = (criteria_of or {}).get(key[0], ())
        for record in group:
            add(record.status, record.scores, record.model_calls, criteria)


class TaskModelSandboxes:
    """The started sandbox of the task x model being run, which its shards share.

    Another task or another model gets a fresh sandbox: what one model's outputs do to a
    worker (a grader that runs them, patched worker code, files, processes) never reaches
    another model's samples. Shards of one task x model share it, because a cold start costs
    about as much as grading ten thousand exact-match samples under gVisor (a sandbox per
    shard cost 35% of the throughput of a 100k-sample run on 2 cores).
    """

    def __init__(self) -> None:
        self._key: tuple[str, str, str | None] | None = None
        self._sandbox: GraderSandbox | None = None

    def get(self, ctx: UnitContext, unit: Unit) -> GraderSandbox:
        key = (unit.task_id, unit.model, ctx.model_endpoint)
        if self._sandbox is None or self._key != key:
            self.close()
            self._sandbox, self._key = task_sandbox(ctx), key
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            sandbox.close()


def program_load_message(runtime: TaskRuntime, exc: ProgramLoadError) -> str:
    error = exc.error
    line = error.get("line")
    specs: dict[str, Any] = dict(runtime.task.grader_programs())
    spec = specs.get(exc.program, runtime.task.preprocess)
    where = f"task {runtime.task.id!r} {exc.program}"
    message = str(error.get("message"))
    at = f", line {line}" if line else ""
    if spec is not None and spec.file and runtime.saved_run:
        # a resumed run runs the code it started with: say so, not the file on disk
        program = runtime.grader if exc.program == "grader" else runtime.preprocess
        copy = f"the copy of {spec.file} saved when run {runtime.saved_run} started"
        where += f" ({copy}{at})"
        if program is not None:
            message = message.replace(program.filename, "it")
    elif spec is not None and spec.file:
        where += f" ({spec.file}{at})"
    elif line:
        where += f" (line {line})"
    return f"{where}: {error.get('type')}: {message}"


def _base_record(
    ctx: UnitContext, unit: Unit, seq: int, row: dict[str, Any], row_id: str
) -> SampleRecord:
    # positional: built for every sample (run_id, sample_id, task_id, model, seq, status, row_id)
    record = SampleRecord(
        ctx.run_id,
        sample_id(ctx.run_id, unit.task_id, unit.model, seq),
        unit.task_id,
        unit.model,
        seq,
        "valid",
        row_id,
    )
    record.dataset_row = row
    return record


def _row_id(runtime: TaskRuntime, row: dict[str, Any], fallback: int | str) -> str:
    id_field = runtime.task.dataset.id_field
    if id_field and row.get(id_field) is not None:
        return str(row[id_field])
    return str(fallback)


def _preprocess(
    ctx: UnitContext,
    sandbox: GraderSandbox,
    unit: Unit,
    rows: list[dict[str, Any]],
    buffer: _Buffer,
) -> list[_Prepared]:
    """Rows after the preprocessor, each with its sequence number and sample id."""
    runtime = ctx.runtime
    base = unit.shard * SEQ_STRIDE
    spec = runtime.task.preprocess
    out: list[_Prepared] = []

    def keep(position: int, row: dict[str, Any], row_id: str) -> None:
        record = _base_record(ctx, unit, base + position, row, row_id)
        out.append(_Prepared(record.seq, record.sample_id, row, row_id, record))

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
                fail(
                    position,
                    row,
                    row_id,
                    _preprocess_error(execution, "transform", "a dict (the row)"),
                )
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
        return _error(
            "preprocess",
            "InvalidPreprocessResult",
            f"{function} returned {capped_repr(execution.value, 200)}; it must return {expected}",
        )
    error = execution.error or {}
    return _error(
        "preprocess",
        str(error.get("type", execution.status)),
        str(error.get("message", "")),
        str(error.get("traceback", "")),
    )


def _candidates(
    ctx: UnitContext, unit: Unit, prepared: list[_Prepared], buffer: _Buffer
) -> Iterator[_Prepared]:
    """Render, fetch candidates and extract; errored samples go to the buffer."""
    runtime = ctx.runtime
    rendered: list[_Prepared] = []
    for p in prepared:
        try:
            prompt, target = runtime.template.render(p.row, runtime.context)
        except TemplateError as exc:
            p.record.status, p.record.error = "errored", _error("render", "TemplateError", str(exc))
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


def _fetch(ctx: UnitContext, unit: Unit, rendered: list[_Prepared]) -> list[Candidate]:
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
    runtime: TaskRuntime, p: _Prepared, candidate: Candidate, stop: Sequence[str]
) -> bool:
    record = p.record
    record.response_id = candidate.response_id
    if candidate.model_calls:
        record.model_calls = dict(candidate.model_calls)
    if candidate.ms is not None:
        record.timings["generation_ms"] = candidate.ms
    if candidate.error is not None:
        record.status, record.error = (
            "errored",
            _error("generation", "GenerationError", candidate.error),
        )
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
        record.status, record.error = "errored", _error("extraction", "ExtractionMiss", str(exc))
        return False
    return True


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
    p: _Prepared, openai: bool = False, templated: bool = False
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


def _grade_samples(
    ctx: UnitContext, sandbox: GraderSandbox, ready: Iterator[_Prepared], buffer: _Buffer
) -> None:
    """Grade each sample once per criterion; one Python grader streams, else they take turns."""
    runtime = ctx.runtime
    task = runtime.task
    fields = task.grader_fields()
    if len(fields) == 1 and not fields[0][1].builtin:
        program, spec = fields[0]
        for p, execution in _execute_criterion(ctx, sandbox, program, spec, ready, buffer):
            outcome = _outcome(execution, spec.metric_id, task.metrics or ())
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
        if isinstance(builtin, ModelJudge | EmbeddingJudge):
            outcomes = judge_samples(
                builtin,
                [grader_inputs(p, openai, templated=True) for p in samples],
                ctx.model_endpoint,
                functools.partial(_open_tokens, ctx, buffer, samples),
            )
            for p, outcome in zip(samples, outcomes, strict=True):
                graded[p.sample_id].append((criterion, outcome, None))
            continue
        if builtin is not None:
            for p in samples:
                sample, item = grader_inputs(p, openai, templated=True)
                graded[p.sample_id].append((criterion, builtin.grade(sample, item), None))
            continue
        for p, execution in _execute_criterion(
            ctx, sandbox, field_name, spec, iter(samples), buffer
        ):
            outcome = _outcome(execution, spec.metric_id, task.metrics or ())
            graded[p.sample_id].append((criterion, outcome, execution))
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
    ctx: UnitContext, buffer: _Buffer, samples: Sequence[_Prepared], count: int
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
    ready: Iterator[_Prepared],
    buffer: _Buffer,
) -> Iterator[tuple[_Prepared, Execution]]:
    """``(sample, execution)`` of one criterion's grader over ``ready``, in order."""
    in_flight: deque[_Prepared] = deque()
    bridge = ctx.bridge
    openai = ctx.runtime.task.grader_inputs == "openai"

    def tokened() -> Iterator[tuple[_Prepared, str]]:
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
    started = time.perf_counter()
    runtime = ctx.runtime
    task = runtime.task
    grader_spec = task.primary_grader
    records = batch_records(ctx, unit)
    ctx.progress.unit_started(unit, len(records))
    by_id = {r.sample_id: r for r in records}
    report = UnitReport(unit, samples=len(records))
    sandbox = GraderSandbox(
        ctx.backend,
        [runtime.grader],
        task_id=task.id,
        model_endpoint=ctx.model_endpoint,
        load_timeout=float(grader_spec.timeout_seconds),
        isolation=grader_spec.resolved_isolation,
        environment=sandbox_environment(ctx.backend, runtime),
    )
    try:
        sandbox.start()
    except ProgramLoadError as exc:
        raise UnitFailed(program_load_message(runtime, exc)) from None
    token = unit.unit_id
    batch_calls: dict[str, int] = {}
    if ctx.bridge is not None:
        token = execution_token()
        ctx.bridge.open_executions([token])
    try:
        payload = [batch_sample(r) for r in records]
        execution = next(
            iter(
                sandbox.execute(
                    runtime.grader.name,
                    [([payload], token)],
                    timeout=float(grader_spec.timeout_seconds),
                )
            )
        )
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
        failed = _outcome(execution, metric_id)
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
    report.seconds = time.perf_counter() - started
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
