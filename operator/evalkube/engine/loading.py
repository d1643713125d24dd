"""Read suite and run files for local runs: YAML with line numbers, referenced files, hashes.

A file may hold an EvalSuite, an EvalRun, or both (two YAML documents). Spec-only files
(``tasks:`` at the top) are accepted too, named after the file. Grader, preprocessor and
dataset paths are relative to the file that names them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any

from evalkube import limits
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
from evalkube.sources import SourceAccess, SourcePin, parse_uri, prepare, read_pinned
from evalkube.sources.files import (
    bounded_lines,
    open_regular,
    read_bounded,
    read_text,
    yaml_documents,
)
from evalkube.sources.formats import parse_json

#: Rows between two entries of a JSONL dataset's :class:`RowIndex`.
ROW_INDEX_EVERY = 1_024


@dataclass(frozen=True, slots=True)
class RowIndex:
    """Where every :data:`ROW_INDEX_EVERY`-th row of a JSONL file starts, noted while its rows
    were counted, so that a unit starting in the middle of the dataset (a parallel run's, a
    resumed run's) seeks there instead of reading every line before it: that read made a
    run's dataset reads grow with the square of its size (a million rows in shards of 10k
    read 50 million lines). Used only on the file it was made from (same device, inode, size
    and modification time, and a line ending before the offset)."""

    identity: tuple[int, int, int, int]
    starts: tuple[tuple[int, int], ...]
    """``(byte offset, lines before it)`` of rows 0, ``ROW_INDEX_EVERY``, twice that..."""

    def seek(self, handle: IO[bytes], skip: int) -> tuple[int, int]:
        """Move ``handle`` to the nearest indexed row at or before row ``skip``: ``(rows left
        to skip, lines before the position)``; ``(skip, 0)`` (not moved) when the index is
        not this file's."""
        entry = min(skip // ROW_INDEX_EVERY, len(self.starts) - 1)
        if entry <= 0 or _identity(handle) != self.identity:
            return skip, 0
        offset, lines_before = self.starts[entry]
        handle.seek(offset - 1)
        if handle.read(1) != b"\n":
            handle.seek(0)
            return skip, 0
        return skip - entry * ROW_INDEX_EVERY, lines_before


def _identity(handle: IO[bytes]) -> tuple[int, int, int, int]:
    info = os.fstat(handle.fileno())
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


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
    access: SourceAccess = field(default_factory=SourceAccess)
    """How ``uri`` sources are reached (the run's ``spec.storage``; in a pod, its mounts)."""
    pins: dict[str, SourcePin] = field(default_factory=dict)
    """``task/dataset`` and ``task/outputs`` -> the pinned ``uri`` source (made once)."""
    prepares: bool = True
    """Whether a missing pin is made here (a unit's pod only reads what was pinned)."""
    local_sources: bool = True
    """Whether a ``uri`` may name a local file (not in a cluster)."""
    row_index: dict[Path, RowIndex] = field(default_factory=dict)
    """JSONL dataset -> where its rows start, noted when they were counted (a unit seeks)."""

    @property
    def name(self) -> str:
        return self.suite.metadata.name

    def task(self, task_id: str) -> TaskSpec:
        return next(t for t in self.suite.spec.tasks if t.id == task_id)

    def pin(self, task: TaskSpec, part: str) -> SourcePin:
        """The pin of a task's ``dataset`` or ``outputs`` uri, made on first use."""
        key = f"{task.id}/{part}"
        if key not in self.pins:
            spec = task.dataset if part == "dataset" else task.outputs
            assert spec is not None
            assert spec.uri is not None
            where = f"tasks[{task.id}].{part}.uri"
            if not self.prepares:
                raise ConfigError(
                    f"{where}: {spec.uri} was not pinned by the run's prepare pod; the unit "
                    "reads only pinned sources"
                )
            base = self.base_dir if self.local_sources else None
            source = parse_uri(spec.uri, where, base, spec.format)
            pin = prepare(source, self.access, where, spec.sha256)
            if part == "outputs" and self._outputs_aligned(task, pin, where):
                pin = pin.model_copy(update={"aligned": True})
            self.pins[key] = pin
        return self.pins[key]

    def _outputs_aligned(self, task: TaskSpec, outputs: SourcePin, where: str) -> bool:
        """Whether outputs record ``i`` is row ``i``'s (one read of both, at pinning): then a
        unit reads only its range of the outputs. Only for ``uri`` datasets (a cluster's)."""
        if task.dataset.uri is None or outputs.rows != self.pin(task, "dataset").rows:
            return False
        id_field = task.dataset.id_field
        rows = iter_dataset(self, task)
        records = read_pinned(outputs, self.access, where)
        with contextlib.closing(rows), contextlib.closing(records):
            for position, (row, record) in enumerate(zip(rows, records, strict=True)):
                row_id = row.get(id_field) if id_field else None
                expected = str(position) if row_id is None else str(row_id)
                if str(record.get("id")) != expected:
                    return False
        return True

    def uri_sources(self) -> list[tuple[TaskSpec, str]]:
        """``(task, part)`` of every ``uri`` source of the suite."""
        return [
            (task, part)
            for task in self.suite.spec.tasks
            for part, spec in (("dataset", task.dataset), ("outputs", task.outputs))
            if spec is not None and spec.uri is not None
        ]


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


def load_files(
    suite_path: Path, run_path: Path | None, *, versioned: bool = True
) -> tuple[LoadedSuite, EvalRun | None]:
    """Load the suite (and the run, from ``run_path`` or from the suite file itself).

    ``versioned=False`` leaves ``version`` empty: nothing is hashed and no ``uri`` source is
    pinned (read), for ``evalkube submit``, whose cluster reads the sources itself."""
    suite_doc, run_doc = _split(suite_path, yaml_documents(suite_path))
    if suite_doc is None:
        raise ConfigError(f"{suite_path}: no EvalSuite found (a document with kind: EvalSuite)")
    if run_path is not None:
        _, run_doc = _split(run_path, yaml_documents(run_path))
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
    if run is not None and run.spec.storage is not None:
        loaded.access = SourceAccess(s3=run.spec.storage.s3)
    for task in suite.spec.tasks:
        for kind, program in task_programs(task):
            loaded.sources[(task.id, kind)] = _source(loaded.base_dir, task, kind, program)
    loaded.version = suite_version(loaded) if versioned else ""
    return loaded, run


def task_programs(task: TaskSpec) -> list[tuple[str, GraderSpec | PreprocessSpec]]:
    """``(kind, spec)`` of the task's code: its Python criteria, then its preprocessor."""
    pre = [("preprocess", task.preprocess)] if task.preprocess is not None else []
    return [*task.grader_programs(), *pre]


def _source(
    base: Path, task: TaskSpec, kind: str, spec: GraderSpec | PreprocessSpec
) -> tuple[str, str]:
    if spec.source is not None:
        return spec.source, f"<{task.id}.{kind}>"
    assert spec.file is not None
    path = (base / spec.file).resolve()
    where = f"tasks[{task.id}].{kind}.file"
    if path.exists():
        return read_text(path, where, limits.SUITE_FILE_BYTES), str(path)
    raise ConfigError(
        f"{where}: cannot read {spec.file!r} (No such file or directory); paths are "
        "relative to the suite file"
    )


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
    for task, part in loaded.uri_sources():  # the bytes a uri names, as pinned
        digest.update(loaded.pin(task, part).identity().encode())
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


def iter_dataset(
    loaded: LoadedSuite, task: TaskSpec, skip: int = 0
) -> Generator[dict[str, Any], None, None]:
    """Stream a task's rows (inline rows or a JSONL / JSON-array file) from row ``skip`` on."""
    dataset = task.dataset
    if dataset.rows is not None:
        yield from (dict(row) for row in islice(dataset.rows, skip, None))
        return
    if dataset.uri is not None:
        where = f"tasks[{task.id}].dataset.uri"
        yield from read_pinned(loaded.pin(task, "dataset"), loaded.access, where, start=skip)
        return
    if task.id in loaded.dataset_paths:
        path = loaded.dataset_paths[task.id]
        where = f"tasks[{task.id}].dataset"
    else:
        if dataset.config_map_ref is not None:
            raise ConfigError(
                f"tasks[{task.id}].dataset.configMapRef works in a cluster; locally use `path`"
            )
        assert dataset.path is not None
        path, where = loaded.base_dir / dataset.path, f"tasks[{task.id}].dataset.path"
    yield from iter_json_rows(path, where, skip=skip, index=loaded.row_index.get(path))


def shard_rows(loaded: LoadedSuite, task: TaskSpec, start: int, stop: int) -> list[dict[str, Any]]:
    """Rows ``start`` to ``stop`` of a task (one shard unit; earlier rows are not parsed, and
    a ``uri`` source is read from the nearest indexed offset: only its range is fetched)."""
    try:
        if task.dataset.uri is not None:
            where = f"tasks[{task.id}].dataset.uri"
            pin = loaded.pin(task, "dataset")
            return list(read_pinned(pin, loaded.access, where, start=start, stop=stop))
        return list(islice(iter_dataset(loaded, task, skip=start), stop - start))
    except MemoryError:
        # rows of up to DATASET_LINE_BYTES_MAX each, a shard of them at once
        raise ConfigError(
            f"tasks[{task.id}].dataset: rows {start}..{stop - 1} do not fit in memory; give the "
            "run a smaller spec.shardSize, or the rows less text"
        ) from None


def count_dataset_rows(loaded: LoadedSuite, task: TaskSpec) -> int:
    """How many rows a task has, to plan its shards before any is run.

    A JSONL file is counted line by line without parsing (a run reads it again anyway), and
    a line that is not an object at all fails here already, naming file and line; a
    malformed object fails when its unit reads it.
    """
    dataset = task.dataset
    if dataset.uri is not None:
        return loaded.pin(task, "dataset").rows
    path = loaded.dataset_paths.get(task.id)
    if path is None and dataset.path is not None and dataset.rows is None:
        path = loaded.base_dir / dataset.path
    if path is None or path.suffix == ".json":
        return sum(1 for _ in iter_dataset(loaded, task))
    where = f"tasks[{task.id}].dataset" + ("" if task.id in loaded.dataset_paths else ".path")
    count = 0
    offset = 0
    starts: list[tuple[int, int]] = []
    with open_regular(path, where) as handle:
        for number, line in bounded_lines(handle, where, path):
            text = line.lstrip()
            if text:
                if not text.startswith(b"{"):
                    raise ConfigError(f"{where}: {path} line {number}: a row must be a JSON object")
                if count % ROW_INDEX_EVERY == 0:
                    starts.append((offset, number - 1))
                count += 1
            offset += len(line)
        loaded.row_index[path] = RowIndex(_identity(handle), tuple(starts))
    return count


def iter_json_rows(
    path: Path, where: str, skip: int = 0, index: RowIndex | None = None
) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file (or a ``.json`` array); bad lines name file and line.

    The first ``skip`` rows of a JSONL file are passed over without parsing them (a unit
    starting in the middle of a dataset that planning has already read once), from the
    nearest row ``index`` (the file's :class:`RowIndex`) knows on. Regular files
    only, lines of at most :data:`limits.DATASET_LINE_BYTES` (read no further), ``.json``
    arrays of at most :data:`limits.DATASET_JSON_BYTES`.
    """
    if path.suffix == ".json":
        data = parse_json(
            read_bounded(path, where, limits.DATASET_JSON_BYTES, "use a JSONL file"),
            f"{where}: {path}",
        )
        if not isinstance(data, list):
            raise ConfigError(f"{where}: {path} must hold a JSON array of objects")
        for position, row in enumerate(data):
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: {path} item {position} is not an object")
            if position >= skip:
                yield row
        return
    with open_regular(path, where) as handle:
        skip, lines_before = (skip, 0) if index is None else index.seek(handle, skip)
        for number, line in bounded_lines(handle, where, path, lines_before):
            if not line.strip():
                continue
            if skip:
                skip -= 1
                continue
            row = parse_json(line, f"{where}: {path} line {number}")
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: {path} line {number}: a row must be a JSON object")
            yield row
