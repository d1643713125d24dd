"""Checks before a run spends anything: datasets, grader imports, providers, keys.

``evalkube validate`` runs all of them; ``evalkube run`` runs them before it records the run
when it would pay for model calls (generated candidates or graders with model access): a
run over precomputed outputs costs nothing to stop at its first broken row. Every problem
found is reported at once, each naming where it is and what to do.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from evalkube.engine.driver import has_model_access
from evalkube.engine.grade import CONVENIENCE_KEYS
from evalkube.engine.loading import LoadedSuite, iter_dataset
from evalkube.engine.runtime import TaskRuntime
from evalkube.engine.task_sandbox import program_load_message, sandbox_environment
from evalkube.grading.template_fields import Path as Path_
from evalkube.grading.template_fields import field_paths, missing, spelled
from evalkube.models import EvalRunSpec, GraderSpec, TaskSpec
from evalkube.models.errors import ConfigError
from evalkube.models.grader import SubGraderSpec
from evalkube.proxy import Upstream, UpstreamError
from evalkube.proxy.providers import key_file_env, providers_from_spec
from evalkube.sandbox import GraderSandbox, ProgramLoadError, SandboxBackend

#: Providers that need no entry under ``providers`` (they are not called over HTTP).
_BUILTIN = ("precomputed", "local")


def pays(loaded: LoadedSuite, spec: EvalRunSpec) -> bool:
    """Whether the run calls models: candidates generated, or graders with model access."""
    generated = any(model.split(":", 1)[0] not in _BUILTIN for model in spec.models)
    return generated or any(has_model_access(t) for t in loaded.suite.spec.tasks)


def check_datasets(loaded: LoadedSuite) -> list[str]:
    """Every row of every dataset parses (file, line and what is wrong otherwise), and has
    every field the task's templates read (a missing one would fail every such sample)."""
    problems = []
    for task in loaded.suite.spec.tasks:
        reads = [] if task.preprocess is not None else template_reads(task)
        try:
            for number, row in enumerate(iter_dataset(loaded, task)):
                for field, path in list(reads):
                    lacks = missing(row, path)
                    if lacks is not None:
                        reads.remove((field, path))  # once per template and field
                        problems.append(
                            f"tasks[{task.id}].{field}: `{spelled('item', path)}` is not in "
                            f"row {number} of the dataset (it has no `{lacks}`); every "
                            "sample of such a row would fail"
                        )
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def template_reads(task: TaskSpec) -> list[tuple[str, Path_]]:
    """``(field, path)`` of each row field the task's templates always read: the prompt and
    target (``item``/``row``) and the built-in criteria's inputs (``item``; an evalkube
    task's convenience keys are not row fields)."""
    templates: list[tuple[str, str, bool]] = []
    if isinstance(task.prompt, str):
        templates.append(("prompt", task.prompt, False))
    elif task.prompt is not None:
        templates += [(f"prompt[{i}].content", m.content, False) for i, m in enumerate(task.prompt)]
    if task.target is not None:
        templates.append(("target", task.target, False))
    for kind, spec in task.grader_fields():
        subs: list[tuple[str, GraderSpec | SubGraderSpec]] = [
            (f"{kind}.graders.{k}", g) for k, g in (spec.graders or {}).items()
        ]
        for at, sub in [(kind, spec), *subs]:
            value = sub.input
            if isinstance(value, str):
                templates.append((f"{at}.input", value, True))
            elif isinstance(value, list):
                templates += [
                    (f"{at}.input[{i}].content", m.content, True) for i, m in enumerate(value)
                ]
            if sub.reference is not None:
                templates.append((f"{at}.reference", sub.reference, True))
    convenience = set() if task.grader_inputs == "openai" else set(CONVENIENCE_KEYS)
    reads: list[tuple[str, Path_]] = []
    for field, source, grader in templates:
        for _, path in field_paths(source, ("item",) if grader else ("item", "row")):
            if not (grader and path[0] in convenience):
                reads.append((field, path))
    return reads


def check_imports(loaded: LoadedSuite, backend: SandboxBackend | None) -> list[str]:
    """Each task's programs load in a sandbox of ``backend`` (imports run there, not here)."""
    problems: list[str] = []
    if backend is None:  # no sandbox to try them in (validate without one)
        return problems
    for task in loaded.suite.spec.tasks:
        runtime = TaskRuntime.build(loaded, task)
        if not runtime.programs:
            continue  # built-in criteria only: nothing to import in a sandbox
        sandbox = GraderSandbox(
            backend,
            runtime.programs,
            task_id=task.id,
            load_timeout=float(task.primary_grader.timeout_seconds),
            isolation=task.primary_grader.resolved_isolation,
            environment=sandbox_environment(backend, runtime),
        )
        try:
            sandbox.start()
        except ProgramLoadError as exc:
            problems.append(program_load_message(runtime, exc))
        finally:
            sandbox.close()
    return problems


def used_providers(spec: EvalRunSpec) -> dict[str, str]:
    """Provider name -> the first model the run uses it for (a probe's model)."""
    used: dict[str, str] = {}
    for model in [*spec.models, spec.judge_model, spec.embedding_model]:
        if model:
            provider, _, name = model.partition(":")
            if provider not in _BUILTIN:
                used.setdefault(provider, name)
    return used


def check_local_models(spec: EvalRunSpec) -> list[str]:
    """``local:`` models the run names can be served here (their optional extra installed)."""
    from evalkube.proxy.local_embeddings import unavailable_reason

    problems = []
    for field, model in (
        *(("models", m) for m in spec.models),
        ("judgeModel", spec.judge_model),
        ("embeddingModel", spec.embedding_model),
    ):
        if model and model.startswith("local:"):
            reason = unavailable_reason(model.split(":", 1)[1])
            if reason is not None:
                problems.append(f"run.spec.{field}: {reason}")
    return problems


def check_providers(spec: EvalRunSpec) -> list[str]:
    """Each provider the run names is declared, has an http(s) base URL, and its key is set."""
    problems = []
    for name in used_providers(spec):
        provider = spec.providers.get(name)
        where = f"run.spec.providers.{name}"
        if provider is None:
            problems.append(f"{where}: provider {name!r} is not declared; add its baseURL")
            continue
        url = urlsplit(provider.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            problems.append(
                f"{where}.baseURL: {provider.base_url!r} is not an http(s) URL "
                "(for example https://api.openai.com/v1)"
            )
        key_file = os.environ.get(key_file_env(name))
        if key_file:
            shown = f"{where}: key file {key_file} ({key_file_env(name)})"
            try:
                if not Path(key_file).read_text().strip():
                    problems.append(f"{shown} is empty")
            except OSError as exc:
                problems.append(f"{shown} cannot be read ({exc.strerror})")
        elif provider.api_key_env and not os.environ.get(provider.api_key_env):
            problems.append(
                f"{where}.apiKeyEnv: the environment variable {provider.api_key_env} is not set "
                f"(or empty); export it with the provider's API key"
            )
    return problems


async def probe_providers(spec: EvalRunSpec) -> list[str]:
    """One real, small call per provider the run uses (its first model)."""
    problems = []
    async with Upstream(providers_from_spec(spec), retries=0) as upstream:
        for name, model in used_providers(spec).items():
            body: dict[str, Any]
            if spec.embedding_model == f"{name}:{model}" and f"{name}:{model}" not in (
                *spec.models,
                spec.judge_model,
            ):
                path, body = "/embeddings", {"model": model, "input": ["ping"]}
            else:
                path = "/responses"
                body = {"model": model, "input": "Reply with OK.", "max_output_tokens": 16}
            try:
                await upstream.call(name, path, body)
            except UpstreamError as exc:
                problems.append(f"probe of provider {name!r} ({model}, POST {path}): {exc}")
    return problems


def preflight(
    loaded: LoadedSuite,
    spec: EvalRunSpec | None,
    backend: SandboxBackend | None,
    *,
    probe: bool = False,
) -> None:
    """Raise :class:`ConfigError` listing every problem found (nothing is run or recorded)."""
    problems = check_datasets(loaded)
    if spec is not None:
        problems += check_providers(spec) + check_local_models(spec)
    if not problems:  # sandboxes and probes only once the cheap checks pass
        problems += check_imports(loaded, backend)
    if spec is not None and probe and not problems:
        problems += asyncio.run(probe_providers(spec))
    if problems:
        raise ConfigError(
            "pre-flight found "
            + (f"{len(problems)} problems:\n- " if len(problems) > 1 else "a problem: ")
            + "\n- ".join(problems)
        )
