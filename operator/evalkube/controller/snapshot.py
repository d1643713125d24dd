"""The suite checks behind EvalSuite status, and the snapshot (:class:`RunSnapshot`) a run
takes of a suite that checks out.

Grader ``file`` references are ``configmap/key`` in a cluster; datasets are ConfigMap keys
(JSONL).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evalkube.controller.kube import Kube
from evalkube.controller.settings import OperatorSettings
from evalkube.engine.validate import check_source
from evalkube.models import ConfigError, EvalRunSpec, EvalSuiteSpec, SpecError, validate_spec
from evalkube.models.snapshot import (
    RunSnapshot,
    SnapshotDataset,
    SnapshotRun,
    SnapshotSuite,
)
from evalkube.sandbox.environment import DEFAULT, STDLIB, image_allowed, is_path
from evalkube.sources import parse_uri

#: Reads ``(namespace, configmap, key)``; returns the value or ``None`` when absent.
ConfigMapReader = Callable[[str, str, str], str | None]


@dataclass
class SuiteCheck:
    """Outcome of checking a suite: its version, sources, dataset sizes, or its problems."""

    version: str = ""
    spec: EvalSuiteSpec | None = None
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)
    datasets: dict[str, SnapshotDataset] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def check_cluster_suite(
    kube: Kube, namespace: str, spec_wire: Mapping[str, Any], images: ImagePolicy | None = None
) -> SuiteCheck:
    """:func:`check_suite` over the ConfigMaps the suite names, read from the cluster."""
    values = {
        ref: await kube.config_map_value(*ref)
        for task in spec_wire.get("tasks") or []
        for ref in config_map_refs(namespace, task)
    }
    return await asyncio.to_thread(
        check_suite, namespace, spec_wire, lambda *ref: values.get(ref), images
    )


def config_map_refs(namespace: str, task: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(namespace, configmap, key)`` of a task's grader/preprocessor files and dataset (read
    from the wire spec: a suite that does not validate still names what it reads)."""
    refs = []
    codes = [task.get("grader"), task.get("preprocess"), *(task.get("graders") or [])]
    for code in codes:
        file = code.get("file") if isinstance(code, dict) else None
        ref = _split_ref(file) if isinstance(file, str) else None
        if ref is not None:
            refs.append((namespace, *ref))
    dataset_ref = (task.get("dataset") or {}).get("configMapRef")
    if isinstance(dataset_ref, dict) and dataset_ref.get("name") and dataset_ref.get("key"):
        refs.append((namespace, dataset_ref["name"], dataset_ref["key"]))
    return refs


def _split_ref(ref: str) -> tuple[str, str] | None:
    name, sep, key = ref.partition("/")
    return (name, key) if sep and name and key else None


@dataclass(frozen=True)
class ImagePolicy:
    """Which grader images a cluster admits: its sandbox image and the platform's patterns."""

    sandbox_image: str
    patterns: tuple[str, ...] = ()


def image_policy(settings: OperatorSettings) -> ImagePolicy:
    return ImagePolicy(settings.sandbox_image, tuple(settings.grader_images))


def check_suite(
    namespace: str,
    spec_wire: Mapping[str, Any],
    read: ConfigMapReader,
    images: ImagePolicy | None = None,
) -> SuiteCheck:
    """Validate a suite in a cluster: spec, code (parses, defines its entry point), references;
    with ``images``, the grader images too (without: any image, as a client that does not know
    the operator's policy checks)."""
    check = SuiteCheck()
    try:
        spec = validate_spec(EvalSuiteSpec, dict(spec_wire), prefix="spec")
    except SpecError as exc:
        check.problems.extend(exc.problems)
        return check
    check.spec = spec
    digest = hashlib.sha256(json.dumps(spec.to_wire(), sort_keys=True).encode())

    def config_map_value(field: str, name: str, key: str) -> str | None:
        text = read(namespace, name, key)
        if text is None:
            check.problems.append(
                f"{field}: ConfigMap {name!r} has no key {key!r} (or does not exist) in "
                f"namespace {namespace}"
            )
        return text

    for index, task in enumerate(spec.tasks):
        where = f"spec.tasks[{index}]"
        codes: list[tuple[str, Any]] = [*task.grader_programs(), ("preprocess", task.preprocess)]
        for kind, code in codes:
            if code is None:
                continue
            source, filename = code.source, f"<{task.id}.{kind}>"
            if source is None:
                ref = _split_ref(code.file or "")
                if ref is None:
                    check.problems.append(f"{where}.{kind}.file: use `configmap-name/key`")
                    continue
                filename = f"configmap/{ref[0]}/{ref[1]}"
                source = config_map_value(f"{where}.{kind}.file", *ref)
                if source is None:
                    continue
            try:
                check_source(
                    source, filename, code.entrypoint, f"{where}.{kind} (task {task.id!r})"
                )
            except ConfigError as exc:
                check.problems.append(str(exc))
                continue
            check.sources[f"{task.id}/{kind}"] = (source, filename)
            digest.update(f"{task.id}/{kind}{source}".encode())
        dataset = task.dataset
        if dataset.rows is not None:
            check.datasets[task.id] = SnapshotDataset(rows=len(dataset.rows))
        elif (cm := dataset.config_map_ref) is not None:
            text = config_map_value(f"{where}.dataset.configMapRef", cm.name, cm.key)
            if text is None:
                continue
            # counted as the runner reads them: lines end at b"\n" only (U+2028 and U+0085
            # are text inside a JSON string, not line ends), blank ones are not rows
            rows = sum(1 for line in text.encode().split(b"\n") if line.strip())
            check.datasets[task.id] = SnapshotDataset(rows=rows, config_map=cm.name, key=cm.key)
            digest.update(text.encode())
        elif dataset.uri is not None:
            # only the URI is checked here: the run's prepare pod reads its metadata (the
            # operator never reads rows), and the run's version then includes what it pinned
            if _cluster_uri(check, f"{where}.dataset.uri", dataset.uri, dataset.format):
                check.datasets[task.id] = SnapshotDataset(uri=dataset.uri)
        else:
            check.problems.append(
                f"{where}.dataset.path: files are not reachable in a cluster; use `uri` "
                "(s3://, pvc://, https:// with sha256) or configMapRef"
            )
        environment = next((g.environment for _, g in task.grader_programs()), None)
        if environment is not None and is_path(environment):
            check.problems.append(
                f"{where}.grader.environment: {environment!r} is a local directory, which a "
                "cluster cannot mount; name an image built FROM the evalkube-sandbox image, "
                "`default` or `stdlib`"
            )
        elif (
            environment is not None
            and environment not in (DEFAULT, STDLIB)
            and images is not None
            and not image_allowed(environment, images.sandbox_image, images.patterns)
        ):
            check.problems.append(
                f"{where}.grader.environment: image {environment!r} is not one this cluster "
                "admits (its image runs the grader's supervisor); use `default` or `stdlib`, "
                "or ask the platform team to add a pattern to the chart's work.graderImages"
            )
        if task.outputs is not None and task.outputs.path is not None:
            check.problems.append(
                f"{where}.outputs.path: files are not reachable in a cluster; use outputs.uri "
                "or outputs.column"
            )
        if task.outputs is not None and task.outputs.uri is not None:
            _cluster_uri(check, f"{where}.outputs.uri", task.outputs.uri, task.outputs.format)
    check.version = "sha256:" + digest.hexdigest()
    return check


def _cluster_uri(check: SuiteCheck, where: str, uri: str, fmt: str | None) -> bool:
    """Whether ``uri`` is one a cluster reads (a problem is noted otherwise)."""
    try:
        parse_uri(uri, where, base_dir=None, fmt=fmt)
    except ConfigError as exc:
        check.problems.append(str(exc))
        return False
    return True


def build_snapshot(
    run: Mapping[str, Any], run_id: str, suite_name: str, check: SuiteCheck
) -> RunSnapshot:
    """The snapshot of a suite that checked out, for ``run`` (the EvalRun object)."""
    assert check.ok, "only a suite that checks out is snapshotted"
    assert check.spec is not None
    meta = run["metadata"]
    return RunSnapshot(
        run=SnapshotRun(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], run_id=run_id
        ),
        suite=SnapshotSuite(name=suite_name, spec=check.spec, version=check.version),
        run_spec=validate_spec(EvalRunSpec, dict(run["spec"]), prefix="spec"),
        sources=check.sources,
        datasets=check.datasets,
    )
