"""The immutable snapshot an EvalRun executes, and the suite checks behind EvalSuite status.

A run copies its suite (spec, grader sources, dataset references and the suite version) into
a ConfigMap when it starts, so editing the suite later never changes a running run. Grader
``file`` references are ``configmap/key`` in a cluster; datasets are ConfigMap keys (JSONL).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evalkube.engine.validate import check_source
from evalkube.models import ConfigError, EvalRunSpec, EvalSuiteSpec, SpecError, validate_spec
from evalkube.sandbox.environment import is_path

#: Reads ``(namespace, configmap, key)``; returns the value or ``None`` when absent.
ConfigMapReader = Callable[[str, str, str], str | None]


@dataclass
class SuiteCheck:
    """Outcome of checking a suite: its version, sources, dataset sizes, or its problems."""

    version: str = ""
    sources: dict[str, list[str]] = field(default_factory=dict)
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _split_ref(ref: str) -> tuple[str, str] | None:
    name, sep, key = ref.partition("/")
    return (name, key) if sep and name and key else None


def check_suite(namespace: str, spec_wire: Mapping[str, Any], read: ConfigMapReader) -> SuiteCheck:
    """Validate a suite in a cluster: spec, code (parses, defines its entry point), references."""
    check = SuiteCheck()
    try:
        spec = validate_spec(EvalSuiteSpec, dict(spec_wire), prefix="spec")
    except SpecError as exc:
        check.problems.extend(exc.problems)
        return check
    digest = hashlib.sha256(json.dumps(spec.to_wire(), sort_keys=True).encode())
    for index, task in enumerate(spec.tasks):
        where = f"spec.tasks[{index}]"
        codes: list[tuple[str, Any]] = [*task.grader_programs(), ("preprocess", task.preprocess)]
        for kind, code in codes:
            if code is None:
                continue
            if code.source is not None:
                source, filename = code.source, f"<{task.id}.{kind}>"
            else:
                ref = _split_ref(code.file or "")
                if ref is None:
                    check.problems.append(f"{where}.{kind}.file: use `configmap-name/key`")
                    continue
                found = read(namespace, *ref)
                filename = f"configmap/{ref[0]}/{ref[1]}"
                if found is None:
                    check.problems.append(
                        f"{where}.{kind}.file: ConfigMap {ref[0]!r} has no key {ref[1]!r} "
                        f"(or does not exist) in namespace {namespace}"
                    )
                    continue
                source = found
            try:
                check_source(
                    source, filename, code.entrypoint, f"{where}.{kind} (task {task.id!r})"
                )
            except ConfigError as exc:
                check.problems.append(str(exc))
                continue
            check.sources[f"{task.id}/{kind}"] = [source, filename]
            digest.update(f"{task.id}/{kind}".encode())
            digest.update(source.encode())
        dataset = task.dataset
        if dataset.rows is not None:
            check.datasets[task.id] = {"rows": len(dataset.rows)}
        elif dataset.config_map_ref is not None:
            ref_name, ref_key = dataset.config_map_ref.name, dataset.config_map_ref.key
            text = read(namespace, ref_name, ref_key)
            if text is None:
                check.problems.append(
                    f"{where}.dataset.configMapRef: ConfigMap {ref_name!r} has no key "
                    f"{ref_key!r} (or does not exist) in namespace {namespace}"
                )
                continue
            rows = sum(1 for line in text.splitlines() if line.strip())
            check.datasets[task.id] = {"configMap": ref_name, "key": ref_key, "rows": rows}
            digest.update(text.encode())
        else:
            check.problems.append(
                f"{where}.dataset.path: files are not reachable in a cluster; use configMapRef"
            )
        environment = next((g.environment for _, g in task.grader_programs()), None)
        if environment is not None and is_path(environment):
            check.problems.append(
                f"{where}.grader.environment: {environment!r} is a local directory, which a "
                "cluster cannot mount; name an image built FROM the evalkube-sandbox image, "
                "`default` or `stdlib`"
            )
        if task.outputs is not None and task.outputs.path is not None:
            check.problems.append(
                f"{where}.outputs.path: files are not reachable in a cluster; use outputs.column"
            )
    check.version = "sha256:" + digest.hexdigest()
    return check


def build_snapshot(
    run: Mapping[str, Any],
    run_id: str,
    suite_name: str,
    suite_spec: Mapping[str, Any],
    check: SuiteCheck,
) -> dict[str, Any]:
    """What the run's ConfigMap holds; the runner and the proxy read it in the pod."""
    spec = validate_spec(EvalRunSpec, dict(run["spec"]), prefix="spec")
    return {
        "run": {
            "namespace": run["metadata"]["namespace"],
            "name": run["metadata"]["name"],
            "uid": run["metadata"]["uid"],
            "run_id": run_id,
        },
        "suite": {"name": suite_name, "spec": dict(suite_spec), "version": check.version},
        "run_spec": spec.to_wire(),
        "sources": check.sources,
        "datasets": check.datasets,
    }
