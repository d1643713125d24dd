"""Per-task things compiled once and reused by every unit: templates, extractor, programs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evalkube.engine.loading import LoadedSuite, task_programs
from evalkube.grading import (
    BuiltinGrader,
    Criterion,
    EmbeddingJudge,
    Extractor,
    Formula,
    FormulaError,
    MissingLibrary,
    ModelJudge,
    MultiGrader,
    PromptTemplate,
    TemplateError,
)
from evalkube.models import EvalSuiteSpec, GraderSpec, TaskSpec
from evalkube.models.errors import ConfigError
from evalkube.sandbox import Program
from evalkube.sandbox.environment import (
    EnvironmentProblem,
    LocalEnvironment,
    is_path,
    resolve_local,
)

Builtin = BuiltinGrader | MultiGrader | ModelJudge | EmbeddingJudge
"""A built-in criterion, ready to grade (the engine runs it, not the sandbox)."""


@dataclass
class TaskRuntime:
    """A task ready to run: compiled templates, the extractor and the sandbox programs."""

    task: TaskSpec
    template: PromptTemplate
    extractor: Extractor
    graders: list[Program]
    """One program per criterion (``grader``, or ``graders[i]``), in the task's order."""
    preprocess: Program | None
    context: dict[str, Any]
    saved_run: str | None = None
    """Set when the programs are the copy saved by this run (messages name it, not files)."""
    environment: LocalEnvironment | None = None
    """A ``grader.environment`` path, resolved and checked; ``None`` for the other values
    (resolved where the sandbox starts: :mod:`evalkube.engine.task_sandbox`)."""
    builtins: dict[str, Builtin] = field(default_factory=dict)
    """The built-in criteria by field (``grader``, ``graders[i]``), run in the engine."""

    @property
    def grader(self) -> Program:
        """The first Python criterion's program (the only one of a ``grade_batch`` task)."""
        return self.graders[0]

    @property
    def programs(self) -> list[Program]:
        return self.graders + ([self.preprocess] if self.preprocess else [])

    def choices(self, row: dict[str, Any]) -> list[str]:
        """``item.choices``: the task's list, or the row field it names."""
        choices = self.task.choices
        if isinstance(choices, list):
            return list(choices)
        value = row.get("choices" if choices is None else choices)
        return [str(c) for c in value] if isinstance(value, list) else []

    @classmethod
    def build(cls, loaded: LoadedSuite, task: TaskSpec) -> TaskRuntime:
        where = f"tasks[{task.id}]"
        messages = task.prompt
        prompt = [(m.role, m.content) for m in messages] if isinstance(messages, list) else messages
        try:
            template = PromptTemplate(prompt, task.target, where)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
        try:
            extractor = Extractor(
                task.extraction.type,
                pattern=task.extraction.pattern,
                field=task.extraction.field,
                ignore_case=task.extraction.ignore_case,
            )
        except Exception as exc:  # re.error on a bad pattern
            raise ConfigError(f"{where}.extraction.pattern: {exc}") from None
        programs = [
            Program(kind, *loaded.sources[(task.id, kind)], spec.entrypoint)
            for kind, spec in task_programs(task)
        ]
        preprocess = programs.pop() if task.preprocess is not None else None
        environment = None
        # one sandbox serves every criterion of the task: the first Python criterion names it
        first = task.grader_programs()[:1]
        named = first[0][1].environment if first else None
        if named is not None and is_path(named):
            try:
                environment = resolve_local(
                    named, field=f"{where}.{first[0][0]}.environment", base=loaded.base_dir
                )
            except EnvironmentProblem as exc:
                raise ConfigError(str(exc)) from None
        builtins: dict[str, Builtin] = {}
        for kind, spec in task.grader_fields():
            if not spec.builtin:
                continue
            try:
                builtins[kind] = builtin_criterion(spec, f"{where}.{kind}")
            except MissingLibrary as exc:
                raise ConfigError(f"{where}.{kind}: {exc}") from None
            except (TemplateError, FormulaError) as exc:
                raise ConfigError(str(exc)) from None
        return cls(
            task,
            template,
            extractor,
            programs,
            preprocess,
            {"few_shot": task.few_shot, "task_id": task.id},
            saved_run=loaded.saved_run,
            environment=environment,
            builtins=builtins,
        )


def builtin_criterion(spec: GraderSpec, where: str) -> Builtin:
    """A built-in criterion compiled (templates, formula, library); raises
    :class:`TemplateError`, :class:`FormulaError` or :class:`MissingLibrary`."""
    if spec.type in ("score_model", "label_model"):
        assert isinstance(spec.input, list)
        return ModelJudge(
            spec.type,
            messages=[(m.role, m.content) for m in spec.input],
            metric_id=spec.metric_id,
            where=where,
            model=spec.model,
            score_range=spec.range,
            labels=spec.labels,
            passing_labels=spec.passing_labels,
            sampling=spec.sampling_params.model_dump(exclude_none=True)
            if spec.sampling_params
            else None,
        )
    if spec.evaluation_metric == "cosine":
        assert isinstance(spec.input, str)
        assert spec.reference is not None
        return EmbeddingJudge(
            input=spec.input, reference=spec.reference, metric_id=spec.metric_id, where=where
        )
    if spec.type == "multi":
        assert spec.graders is not None
        assert spec.calculate_output is not None
        graders = {
            name: BuiltinGrader(
                sub.type,
                input=sub.input,
                reference=sub.reference,
                metric_id=name,
                where=f"{where}.graders.{name}",
                operation=sub.operation,
                evaluation_metric=sub.evaluation_metric,
            )
            for name, sub in spec.graders.items()
        }
        formula = Formula(spec.calculate_output, graders, f"{where}.calculateOutput")
        return MultiGrader(graders, formula, spec.metric_id)
    assert isinstance(spec.input, str)
    assert spec.reference is not None
    return BuiltinGrader(
        spec.type,
        input=spec.input,
        reference=spec.reference,
        metric_id=spec.metric_id,
        where=where,
        operation=spec.operation,
        evaluation_metric=spec.evaluation_metric,
    )


def task_criteria(task: TaskSpec) -> tuple[Criterion, ...]:
    """The task's criteria as the aggregates count them."""
    return tuple(
        Criterion(g.name or g.metric_id, g.metric_id, g.resolved_pass_threshold)
        for g in task.criteria
    )


def suite_criteria(suite: EvalSuiteSpec) -> dict[str, tuple[Criterion, ...]]:
    """Criteria per task id, for :func:`evalkube.local.engine.aggregate_results`."""
    return {task.id: task_criteria(task) for task in suite.tasks}
