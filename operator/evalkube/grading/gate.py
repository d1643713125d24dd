"""Evaluate an EvalRun's gate on its results: pure, so the operator and ``evalkube run``
decide the same way (the operator writes the ``Passed`` condition, the CLI its exit code)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from evalkube.grading.compare import KeyedScores, MetricDelta, compare_runs
from evalkube.models import BaselineSpec, GateCheck, GateSpec, GateStatus, TaskModelResult


class _Run(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def phase(self) -> str: ...


class RunHistory(KeyedScores, Protocol):
    """The store reads a gate needs (:class:`evalkube.store.ResultStore` has them)."""

    def get_run(self, run_id: str) -> _Run | None: ...

    def last_run(
        self, suite_name: str, *, phase: str = ..., id_prefix: str = ..., exclude: str = ...
    ) -> _Run | None: ...


#: Failed checks named in the condition message before "and N more".
MESSAGE_CHECKS = 5


def evaluate_gate(
    gate: GateSpec,
    results: Sequence[TaskModelResult],
    *,
    baseline: str | None = None,
    deltas: Sequence[MetricDelta] | None = None,
    baseline_problem: str | None = None,
) -> GateStatus:
    """The gate's checks on ``results``; ``deltas`` against ``baseline`` when one was found,
    ``baseline_problem`` when the named baseline could not be used."""
    checks: list[GateCheck] = []
    for threshold in gate.thresholds:
        matched = [
            r
            for r in results
            if (threshold.task is None or r.task == threshold.task)
            and (threshold.model is None or r.model == threshold.model)
            and (threshold.metric in r.metrics or threshold.task is not None)
        ]
        if not matched:
            scope = "/".join(filter(None, (threshold.task, threshold.model))) or "any task"
            checks.append(
                GateCheck(
                    name=f"min {scope} {threshold.metric}",
                    kind="min",
                    task=threshold.task,
                    model=threshold.model,
                    metric=threshold.metric,
                    passed=False,
                    threshold=threshold.min,
                    message=f"no result has metric {threshold.metric!r} ({scope})",
                )
            )
        for result in matched:
            value = result.metrics.get(threshold.metric)
            passed = value is not None and value >= threshold.min
            if value is None:
                message = f"metric {threshold.metric!r} missing (every sample errored?)"
            else:
                message = "" if passed else f"{value:.4f} < {threshold.min:g}"
            checks.append(
                GateCheck(
                    name=f"min {result.task}/{result.model} {threshold.metric}",
                    kind="min",
                    task=result.task,
                    model=result.model,
                    metric=threshold.metric,
                    passed=passed,
                    value=value,
                    threshold=threshold.min,
                    message=message,
                )
            )
    if gate.max_error_rate is not None:
        for result in results:
            samples = result.counts.samples
            rate = result.counts.errored / samples if samples else 0.0
            passed = rate <= gate.max_error_rate
            checks.append(
                GateCheck(
                    name=f"errors {result.task}/{result.model}",
                    kind="errors",
                    task=result.task,
                    model=result.model,
                    passed=passed,
                    value=rate,
                    threshold=gate.max_error_rate,
                    message=""
                    if passed
                    else f"{result.counts.errored}/{samples} errored "
                    f"({rate:.1%} > {gate.max_error_rate:.1%})",
                )
            )
    if gate.baseline is not None:
        checks.extend(_baseline_checks(gate.baseline, baseline, deltas, baseline_problem))
    return GateStatus(passed=all(c.passed for c in checks), baseline=baseline, checks=checks)


def _baseline_checks(
    spec: BaselineSpec,
    baseline: str | None,
    deltas: Sequence[MetricDelta] | None,
    problem: str | None,
) -> list[GateCheck]:
    if problem is not None:
        return [_baseline_check(False, problem)]
    if baseline is None:
        return [
            _baseline_check(True, "no earlier succeeded run of this suite: nothing to compare with")
        ]
    checks = []
    for d in deltas or ():
        dropped = d.significant_drop(spec.max_regression)
        checks.append(
            GateCheck(
                name=f"baseline {d.task}/{d.model} {d.metric}",
                kind="baseline",
                task=d.task,
                model=d.model,
                metric=d.metric,
                passed=not dropped,
                value=d.delta,
                threshold=-spec.max_regression,
                message=(
                    f"dropped {d.baseline_mean:.4f} -> {d.mean:.4f} "
                    f"({d.confidence:.0%} CI of the change {d.ci_low:+.4f}..{d.ci_high:+.4f}, "
                    f"allowed -{spec.max_regression:g}; {d.regressed} of {d.shared} "
                    f"samples worse) vs {baseline}"
                    if dropped
                    else ""
                ),
            )
        )
    return checks or [
        _baseline_check(False, f"{baseline} shares no task x model samples with this run")
    ]


def _baseline_check(passed: bool, message: str) -> GateCheck:
    """The one baseline check when no metric was compared (why not, or nothing to)."""
    return GateCheck(name="baseline", kind="baseline", passed=passed, message=message)


def gate_run(
    store: RunHistory,
    gate: GateSpec,
    run_id: str,
    results: Sequence[TaskModelResult],
    *,
    suite: str,
    baseline_id: str | None = None,
    baseline_problem: str | None = None,
    id_prefix: str = "",
) -> GateStatus:
    """Evaluate ``gate`` on a finished run: find the baseline (``baseline_id`` when the caller
    resolved a named one, else the latest earlier Succeeded run of ``suite`` among ids starting
    with ``id_prefix``), compare with it, and check everything."""
    spec = gate.baseline
    deltas: list[MetricDelta] | None = None
    if spec is not None and baseline_problem is None:
        if spec.last_succeeded:
            last = store.last_run(suite, id_prefix=id_prefix, exclude=run_id)
            baseline_id = last.run_id if last is not None else None
        elif baseline_id is not None:
            record = store.get_run(baseline_id)
            if record is None:
                baseline_problem = f"baseline run {spec.run!r} has no results in the store"
            elif record.phase != "Succeeded":
                baseline_problem = f"baseline run {spec.run!r} is {record.phase}, not Succeeded"
        if baseline_id is not None and baseline_problem is None:
            deltas = compare_runs(store, baseline_id, run_id, confidence=spec.confidence)
    return evaluate_gate(
        gate,
        results,
        baseline=baseline_id if baseline_problem is None else None,
        deltas=deltas,
        baseline_problem=baseline_problem,
    )


def gate_message(status: GateStatus) -> str:
    """The Passed condition's message: the failed checks, or a count of passed ones."""
    failed = [c for c in status.checks if not c.passed]
    if not failed:
        return f"{len(status.checks)} checks passed"
    parts = [f"{c.name}: {c.message}" for c in failed[:MESSAGE_CHECKS]]
    if len(failed) > MESSAGE_CHECKS:
        parts.append(f"and {len(failed) - MESSAGE_CHECKS} more")
    return "; ".join(parts)
