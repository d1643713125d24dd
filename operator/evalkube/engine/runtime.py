"""Per-task things compiled once and reused by every unit: templates, extractor, programs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalkube.engine.loading import ConfigError, LoadedSuite
from evalkube.grading import Extractor, PromptTemplate, TemplateError
from evalkube.models import TaskSpec
from evalkube.sandbox import Program
from evalkube.sandbox.environment import (
    EnvironmentProblem,
    LocalEnvironment,
    is_path,
    resolve_local,
)


@dataclass
class TaskRuntime:
    """A task ready to run: compiled templates, the extractor and the sandbox programs."""

    task: TaskSpec
    template: PromptTemplate
    extractor: Extractor
    grader: Program
    preprocess: Program | None
    context: dict[str, Any]
    saved_run: str | None = None
    """Set when the programs are the copy saved by this run (messages name it, not files)."""
    environment: LocalEnvironment | None = None
    """A ``grader.environment`` path, resolved and checked; ``None`` for the other values
    (resolved where the sandbox starts: :func:`evalkube.engine.runner.sandbox_environment`)."""

    @property
    def programs(self) -> list[Program]:
        return [self.grader] + ([self.preprocess] if self.preprocess else [])

    def choices(self, row: dict[str, Any]) -> list[str]:
        """``item.choices``: the task's list, or the row field it names."""
        choices = self.task.choices
        if choices is None:
            value = row.get("choices")
            return [str(c) for c in value] if isinstance(value, list) else []
        if isinstance(choices, str):
            value = row.get(choices)
            return [str(c) for c in value] if isinstance(value, list) else []
        return list(choices)

    @classmethod
    def build(cls, loaded: LoadedSuite, task: TaskSpec) -> TaskRuntime:
        where = f"tasks[{task.id}]"
        prompt: str | list[tuple[str, str]] | None
        if isinstance(task.prompt, list):
            prompt = [(m.role, m.content) for m in task.prompt]
        else:
            prompt = task.prompt
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
        source, filename = loaded.sources[(task.id, "grader")]
        grader = Program("grader", source, filename, task.grader.entrypoint)
        preprocess = None
        if task.preprocess is not None:
            source, filename = loaded.sources[(task.id, "preprocess")]
            preprocess = Program("preprocess", source, filename, task.preprocess.entrypoint)
        environment = None
        if task.grader.environment is not None and is_path(task.grader.environment):
            try:
                environment = resolve_local(
                    task.grader.environment,
                    field=f"{where}.grader.environment",
                    base=loaded.base_dir,
                )
            except EnvironmentProblem as exc:
                raise ConfigError(str(exc)) from None
        return cls(
            task,
            template,
            extractor,
            grader,
            preprocess,
            {"few_shot": task.few_shot, "task_id": task.id},
            loaded.saved_run,
            environment,
        )
