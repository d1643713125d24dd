"""The sandbox a task's graders run in: started with the task's programs and environment,
shared by the shards of one task x model, and why it would not load."""

from __future__ import annotations

from evalkube import limits
from evalkube.engine.loading import task_programs
from evalkube.engine.plan import Unit
from evalkube.engine.runtime import TaskRuntime
from evalkube.engine.unit_context import UnitContext, UnitFailed
from evalkube.models import TaskSpec
from evalkube.sandbox import GraderSandbox, ProgramLoadError, SandboxBackend
from evalkube.sandbox.environment import EnvironmentProblem, LocalEnvironment, resolve_local


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


def task_sandbox(ctx: UnitContext) -> GraderSandbox:
    """Start a sandbox with the task's programs; :class:`UnitFailed` when they do not load."""
    runtime, task = ctx.runtime, ctx.runtime.task
    model_endpoint = ctx.model_endpoint if grader_calls_models(task) else None
    sandbox = GraderSandbox(
        ctx.backend,
        runtime.programs,
        task_id=task.id,
        model_endpoint=model_endpoint,
        load_timeout=float(max(g.timeout_seconds for g in task.criteria)),
        batch_size=limits.WORKER_BATCH_SIZE_MODEL_ACCESS
        if model_endpoint
        else limits.WORKER_BATCH_SIZE,
        isolation="sample"
        if any(g.resolved_isolation == "sample" for g in task.criteria)
        else "unit",
        environment=sandbox_environment(ctx.backend, runtime),
    )
    return started(sandbox, runtime)


def started(sandbox: GraderSandbox, runtime: TaskRuntime) -> GraderSandbox:
    """``sandbox``, started; :class:`UnitFailed` naming the program that does not load."""
    try:
        sandbox.start()
    except ProgramLoadError as exc:
        raise UnitFailed(program_load_message(runtime, exc)) from None
    return sandbox


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
    spec = dict(task_programs(runtime.task)).get(exc.program)
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
