"""Read suite and run files for local runs: YAML with line numbers, referenced files, hashes.

A file may hold an EvalSuite, an EvalRun, or both (two YAML documents). Spec-only files
(``tasks:`` at the top) are accepted too, named after the file. Grader, preprocessor and
dataset paths are relative to the file that names them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import yaml

from evalkube import jsonfast
from evalkube.models import (
    ConfigError,
    EvalRun,
    EvalRunSpec,
    EvalSuite,
    GraderSpec,
    PreprocessSpec,
    SpecError,
    TaskSpec,
    validate_spec,
)
from evalkube.models.run import PRECOMPUTED


@dataclass
class LoadedSuite:
    """A validated suite, where it came from, its sources and its version hash."""

    suite: EvalSuite
    base_dir: Path
    sources: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    """``(task_id, "grader"|"preprocess")`` -> ``(source, filename)``."""
    version: str = ""
    dataset_paths: dict[str, Path] = field(default_factory=dict)
    """Task id -> JSONL file, for datasets given by reference (ConfigMaps mounted in a pod)."""
    suite_file: Path | None = None
    """The file the suite was loaded from (``--resume --reload`` loads it again)."""
    saved_run: str | None = None
    """The run whose saved copy of the code this is (plain ``--resume``), for messages."""

    @property
    def name(self) -> str:
        return self.suite.metadata.name

    def task(self, task_id: str) -> TaskSpec:
        return next(t for t in self.suite.spec.tasks if t.id == task_id)


def read_yaml_documents(path: Path) -> list[Any]:
    """All YAML documents of ``path``; syntax errors name the line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError(f"{path}: YAML error at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None


def _split(path: Path, documents: list[Any]) -> tuple[Any | None, Any | None]:
    suite_doc = run_doc = None
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: document {index + 1} is not a mapping")
        kind = doc.get("kind")
        if kind == "EvalSuite" or (kind is None and "tasks" in doc):
            suite_doc = doc if kind else {"metadata": {"name": path.stem}, "spec": doc}
        elif kind == "EvalRun" or (kind is None and "models" in doc):
            run_doc = doc if kind else {"metadata": {"name": path.stem}, "spec": doc}
        else:
            raise ConfigError(
                f"{path}: document {index + 1} has kind {kind!r}; expected EvalSuite or EvalRun"
            )
    return suite_doc, run_doc


def load_files(suite_path: Path, run_path: Path | None) -> tuple[LoadedSuite, EvalRun | None]:
    """Load the suite (and the run, from ``run_path`` or from the suite file itself)."""
    suite_doc, run_doc = _split(suite_path, read_yaml_documents(suite_path))
    if suite_doc is None:
        raise ConfigError(f"{suite_path}: no EvalSuite found (a document with kind: EvalSuite)")
    if run_path is not None:
        _, run_doc = _split(run_path, read_yaml_documents(run_path))
        if run_doc is None:
            raise ConfigError(f"{run_path}: no EvalRun found (a document with kind: EvalRun)")
    try:
        suite = validate_spec(EvalSuite, suite_doc, prefix="", source=str(suite_path))
        run = (
            validate_spec(EvalRun, run_doc, prefix="", source=str(run_path or suite_path))
            if run_doc is not None
            else None
        )
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    loaded = LoadedSuite(suite, suite_path.resolve().parent, suite_file=suite_path.resolve())
    for task in suite.spec.tasks:
        for kind, grader in task.grader_programs():
            loaded.sources[(task.id, kind)] = _source(loaded.base_dir, task, kind, grader)
        if task.preprocess is not None:
            loaded.sources[(task.id, "preprocess")] = _source(
                loaded.base_dir, task, "preprocess", task.preprocess
            )
    loaded.version = suite_version(loaded)
    return loaded, run


def _source(
    base: Path, task: TaskSpec, kind: str, spec: GraderSpec | PreprocessSpec
) -> tuple[str, str]:
    if spec.source is not None:
        return spec.source, f"<{task.id}.{kind}>"
    assert spec.file is not None
    path = (base / spec.file).resolve()
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except OSError as exc:
        raise ConfigError(
            f"tasks[{task.id}].{kind}.file: cannot read {spec.file!r} ({exc.strerror}); "
            "paths are relative to the suite file"
        ) from None


def suite_version(loaded: LoadedSuite) -> str:
    """``sha256:`` over the canonical spec, the code and every referenced file."""
    digest = hashlib.sha256()
    digest.update(json.dumps(loaded.suite.spec.to_wire(), sort_keys=True).encode())
    for key in sorted(loaded.sources):
        digest.update(repr(key).encode())
        digest.update(loaded.sources[key][0].encode())
    for task in loaded.suite.spec.tasks:
        for ref in (task.dataset.path, task.outputs.path if task.outputs else None):
            if ref:
                path = loaded.base_dir / ref
                if path.is_file():
                    with path.open("rb") as handle:
                        for block in iter(lambda: handle.read(1 << 20), b""):
                            digest.update(block)
    return "sha256:" + digest.hexdigest()


def resolve_run_spec(
    loaded: LoadedSuite, run: EvalRun | None, models: list[str] | None
) -> EvalRunSpec:
    """The run's spec; without a run file every task must have precomputed outputs."""
    if run is not None:
        spec = run.spec
        if models:
            spec = spec.model_copy(update={"models": models})
    else:
        chosen = models or [PRECOMPUTED]
        try:
            spec = validate_spec(EvalRunSpec, {"models": chosen}, prefix="run.spec")
        except SpecError as exc:
            raise ConfigError(str(exc)) from None
    for model in spec.models:
        if model.split(":", 1)[0] == PRECOMPUTED:
            missing = [t.id for t in loaded.suite.spec.tasks if t.outputs is None]
            if missing:
                raise ConfigError(
                    f"model {model!r} needs precomputed outputs but tasks {missing} have no "
                    "`outputs`; add outputs: {column: ...} or pass a RUN.yaml with real models"
                )
        else:
            without_prompt = [t.id for t in loaded.suite.spec.tasks if t.prompt is None]
            if without_prompt:
                raise ConfigError(
                    f"model {model!r} generates candidates but tasks {without_prompt} have no "
                    "`prompt`"
                )
    return spec


def iter_dataset(loaded: LoadedSuite, task: TaskSpec, skip: int = 0) -> Iterator[dict[str, Any]]:
    """Stream a task's rows (inline rows or a JSONL / JSON-array file) from row ``skip`` on."""
    dataset = task.dataset
    if dataset.rows is not None:
        yield from (dict(row) for row in islice(dataset.rows, skip, None))
        return
    if task.id in loaded.dataset_paths:
        yield from iter_json_rows(
            loaded.dataset_paths[task.id], f"tasks[{task.id}].dataset", skip=skip
        )
        return
    if dataset.config_map_ref is not None:
        raise ConfigError(
            f"tasks[{task.id}].dataset.configMapRef works in a cluster; locally use `path`"
        )
    assert dataset.path is not None
    path = loaded.base_dir / dataset.path
    yield from iter_json_rows(path, f"tasks[{task.id}].dataset.path", skip=skip)


def shard_rows(loaded: LoadedSuite, task: TaskSpec, start: int, stop: int) -> list[dict[str, Any]]:
    """Rows ``start`` to ``stop`` of a task (one shard unit; earlier rows are not parsed)."""
    return list(islice(iter_dataset(loaded, task, skip=start), stop - start))


def count_dataset_rows(loaded: LoadedSuite, task: TaskSpec) -> int:
    """How many rows a task has, to plan its shards before any is run.

    A JSONL file is counted line by line without parsing (a run reads it again anyway), and
    a line that is not an object at all fails here already, naming file and line; a
    malformed object fails when its unit reads it.
    """
    dataset = task.dataset
    path = loaded.dataset_paths.get(task.id)
    if path is None and dataset.path is not None and dataset.rows is None:
        path = loaded.base_dir / dataset.path
    if path is None or path.suffix == ".json":
        return sum(1 for _ in iter_dataset(loaded, task))
    where = f"tasks[{task.id}].dataset" + ("" if task.id in loaded.dataset_paths else ".path")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path} ({exc.strerror})") from None
    count = 0
    with handle:
        for number, line in enumerate(handle, start=1):
            text = line.lstrip()
            if not text:
                continue
            if not text.startswith(b"{"):
                raise ConfigError(f"{where}: {path} line {number}: a row must be a JSON object")
            count += 1
    return count


def iter_json_rows(path: Path, where: str, skip: int = 0) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file (or a ``.json`` array); bad lines name file and line.

    The first ``skip`` rows of a JSONL file are passed over without parsing them (a unit
    starting in the middle of a dataset that planning has already read once).
    """
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path} ({exc.strerror})") from None
    with handle:
        if path.suffix == ".json":
            data = json.load(handle)
            if not isinstance(data, list):
                raise ConfigError(f"{where}: {path} must hold a JSON array of objects")
            for index, row in enumerate(data):
                if not isinstance(row, dict):
                    raise ConfigError(f"{where}: {path} item {index} is not an object")
                if index >= skip:
                    yield row
            return
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if skip:
                skip -= 1
                continue
            try:
                row = jsonfast.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{where}: {path} line {number}: invalid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: {path} line {number}: a row must be a JSON object")
            yield row
