"""What a finished run becomes in an experiment tracker: params, tags and metrics (pure).

Names come from suites, models and graders (a grader's score names are untrusted), so every
key is reduced to what MLflow accepts (letters, digits, ``_ - . : /`` and spaces, no empty or
``..`` path parts, at most 250 characters) and every value is cut to MLflow's caps, with keys
made unique when two names reduce to the same key.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkube import limits
from evalkube.models import EvalRunSpec, GateStatus, TaskModelResult

_BAD = re.compile(r"[^\w.\- :]")


@dataclass(frozen=True)
class RunFacts:
    """A finished run as its caller knows it (``evalkube run`` or the operator)."""

    run_id: str
    suite: str
    suite_version: str
    phase: str
    spec: EvalRunSpec
    results: Sequence[TaskModelResult]
    gate: GateStatus | None = None
    sandbox: str = ""
    run_name: str = ""
    """The MLflow run's name: the EvalRun's name in a cluster, the run id locally."""
    origin: Mapping[str, str] = field(default_factory=dict)
    """Where it ran (``namespace``, ``evalrun``, ``schedule``), as ``evalkube.*`` tags."""


@dataclass
class TrackedContent:
    """Everything logged for one run besides its artifacts."""

    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]


def key(*parts: str) -> str:
    """An MLflow key from name parts (task, model, metric), joined by ``/``."""
    cleaned = [_BAD.sub("_", part).strip() or "_" for part in parts]
    cleaned = ["_" if part in (".", "..") else part for part in cleaned]
    joined = "/".join(cleaned)
    if len(joined) <= limits.MLFLOW_KEY_CHARS:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:10]
    return joined[: limits.MLFLOW_KEY_CHARS - 11] + "-" + digest


def _value(value: Any, cap: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= cap else text[: cap - 1] + "…"


def describe(facts: RunFacts) -> TrackedContent:
    """Params (suite version, models, generation parameters, gate), tags (run id, phase, origin,
    gate outcome) and metrics (every task x model x metric, the sample counts, model calls)."""
    spec = facts.spec
    params: dict[str, Any] = {
        "suite": facts.suite,
        "suite_version": facts.suite_version,
        "models": ",".join(spec.models),
        "judge_model": spec.judge_model,
        "embedding_model": spec.embedding_model,
        "sandbox": facts.sandbox or None,
        "gate": spec.gate.to_wire() if spec.gate is not None else None,
    }
    generation = spec.generation.model_dump(mode="json", by_alias=True, exclude_none=True)
    for name, value in sorted(generation.items()):
        params[f"generation.{name}"] = value
    tags = {
        "evalkube.run_id": facts.run_id,
        "evalkube.phase": facts.phase,
        "evalkube.suite": facts.suite,
        "mlflow.runName": facts.run_name or facts.run_id,
        **{f"evalkube.{name}": value for name, value in sorted(facts.origin.items())},
    }
    if facts.gate is not None:
        tags["evalkube.gate"] = "passed" if facts.gate.passed else "failed"
    metrics: dict[str, float] = {}

    def put(name: str, value: float) -> None:
        if not math.isfinite(value):
            return
        unique, n = name, 1
        while unique in metrics:
            n += 1
            unique = f"{name[: limits.MLFLOW_KEY_CHARS - 4]}-{n}"
        metrics[unique] = value

    for result in facts.results:
        for metric, value in result.metrics.items():
            put(key(result.task, result.model, metric), float(value))
        for count in ("samples", "valid", "invalid", "errored"):
            put(key(result.task, result.model, "count", count), getattr(result.counts, count))
        for purpose, calls in sorted(result.model_calls.items()):
            put(key(result.task, result.model, "model_calls", purpose), float(calls))
    if facts.gate is not None:
        put("gate_passed", 1.0 if facts.gate.passed else 0.0)
    return TrackedContent(
        params={
            key(name): _value(value, limits.MLFLOW_PARAM_CHARS)
            for name, value in params.items()
            if value is not None and value != ""
        },
        tags={key(name): _value(value, limits.MLFLOW_TAG_CHARS) for name, value in tags.items()},
        metrics=metrics,
    )
