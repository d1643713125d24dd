"""MLflow tracking of local runs: ``evalkube run --mlflow URI`` and ``evalkube track RUN_ID``.

``evalkube run`` starts the logging in a thread once the run is recorded (its phase and scores
never depend on it) and waits for it, at most :data:`~evalkube.limits.MLFLOW_LOCAL_WAIT_SECONDS`,
after printing the scores: a tracking server that is down costs a warning, never the run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from evalkube import limits
from evalkube.models import EvalRunSpec, GateStatus, TaskModelResult
from evalkube.reporting.console import EXIT_CONFIG, EXIT_RUNTIME, DbOption, errors, fail, open_store
from evalkube.reporting.report import render_report
from evalkube.tracking import (
    Artifact,
    Logged,
    MlflowTarget,
    RunFacts,
    TrackingFailed,
    describe,
    log_run,
)
from evalkube.tracking.artifacts import run_artifacts
from evalkube.tracking.mlflow_log import shown_uri

#: The environment variables ``--mlflow`` and ``--mlflow-experiment`` default to.
URI_ENV = "EVALKUBE_MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "EVALKUBE_MLFLOW_EXPERIMENT"
#: ``--mlflow-experiment`` of ``track`` and ``run``.
MlflowExperiment = Annotated[
    str | None,
    typer.Option(
        "--mlflow-experiment",
        envvar=EXPERIMENT_ENV,
        help="MLflow experiment [default: the run file's, else evalkube/SUITE]",
    ),
]
REPORT = "report.html"


def run_spec(record_spec: dict[str, Any]) -> EvalRunSpec:
    """The EvalRun spec of a recorded run (its snapshot's ``run_spec``)."""
    return EvalRunSpec.model_validate(record_spec.get("run_spec") or {"models": ["precomputed"]})


def target_for(
    spec: EvalRunSpec, uri: str | None, experiment: str | None, suite: str
) -> MlflowTarget | None:
    """Where to log: ``--mlflow`` (or its variable), else the run file's
    ``spec.tracking.mlflow``; credentials are MLflow's own variables (``MLFLOW_TRACKING_TOKEN``,
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), read by the MLflow client."""
    declared = spec.tracking.mlflow if spec.tracking is not None else None
    uri = uri or (declared.tracking_uri if declared is not None else None)
    if not uri:
        return None
    name = experiment or (declared.experiment if declared is not None else None)
    return MlflowTarget(uri, name or f"evalkube/{suite}")


def log_local_run(
    db: str | None,
    run_id: str,
    target: MlflowTarget,
    results: Sequence[TaskModelResult] | None = None,
    gate: GateStatus | None = None,
) -> Logged:
    """Log a recorded run with its HTML report and samples; where it went."""
    with open_store(db) as store:
        record = store.get_run(run_id)
        if record is None:
            raise TrackingFailed(f"run {run_id!r} is not in the store")
        if results is None:
            wire = (record.summary or {}).get("results") or []
            results = [TaskModelResult.model_validate(r) for r in wire]
        facts = RunFacts(
            run_id=run_id,
            suite=record.suite_name,
            suite_version=record.suite_version,
            phase=record.phase,
            spec=run_spec(record.spec),
            results=results,
            gate=gate,
            sandbox=record.sandbox,
            run_name=run_id,
        )

        def report(path: Path) -> None:
            html = render_report(store, run_id)
            path.write_text(html, encoding="utf-8", errors="backslashreplace")

        artifacts = [Artifact(REPORT, report), *run_artifacts(store, run_id, results)]
        return log_run(target, run_id, record.phase, describe(facts), artifacts)


class Background:
    """Logging that runs while ``evalkube run`` prints; :meth:`finish` waits and reports."""

    def __init__(self, target: MlflowTarget, work: Any) -> None:
        self.target = target
        self.outcome: Logged | TrackingFailed | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Any) -> None:
        try:
            self.outcome = work()
        except TrackingFailed as exc:
            self.outcome = exc
        except Exception as exc:  # never the run's failure: say what it was
            self.outcome = TrackingFailed(f"MLflow logging failed: {type(exc).__name__}: {exc}")

    def finish(self, run_id: str) -> bool:
        """Wait (bounded) and print the outcome; whether the run was logged."""
        self._thread.join(limits.MLFLOW_LOCAL_WAIT_SECONDS)
        outcome = self.outcome
        where = escape(shown_uri(self.target.tracking_uri))
        if isinstance(outcome, Logged):
            errors.print(
                f"mlflow: logged run {escape(run_id)} as MLflow run {escape(outcome.run_id)} in "
                f"experiment {escape(self.target.experiment)!r}: {escape(outcome.url)}",
                highlight=False,
                soft_wrap=True,
            )
            return True
        reason = (
            str(outcome)
            if outcome is not None
            else f"still logging after {limits.MLFLOW_LOCAL_WAIT_SECONDS} s; gave up waiting"
        )
        errors.print(
            f"[yellow]warning:[/] {escape(reason)}\nthe run is recorded as it ended; log it "
            f"later with `evalkube track {escape(run_id)} --mlflow {where}`",
            highlight=False,
            soft_wrap=True,
        )
        return False


def start(
    db: str | None,
    run_id: str,
    suite: str,
    results: Sequence[TaskModelResult],
    gate: GateStatus | None,
    uri: str | None,
    experiment: str | None,
) -> Background | None:
    """Start logging a finished local run when a tracking server is named; else ``None``."""
    with open_store(db) as store:
        record = store.get_run(run_id)
    spec = run_spec(record.spec) if record is not None else None
    target = target_for(spec, uri, experiment, suite) if spec is not None else None
    if target is None:
        return None
    return Background(target, lambda: log_local_run(db, run_id, target, results, gate))


def track(
    run_id: Annotated[str, typer.Argument(help="Run id (see `evalkube runs`)")],
    mlflow: Annotated[
        str | None,
        typer.Option("--mlflow", envvar=URI_ENV, help="MLflow tracking URI"),
    ] = None,
    experiment: MlflowExperiment = None,
    db: DbOption = None,
) -> None:
    """Log a recorded run to MLflow (params, metrics, the HTML report and samples as artifacts):
    one that ran without --mlflow, or whose tracking server was down. Logging it again updates
    the same MLflow run."""
    with open_store(db) as store:
        record = store.get_run(run_id)
    if record is None:
        fail(f"run {run_id!r} is not in the store; list its runs with `evalkube runs`", EXIT_CONFIG)
    target = target_for(run_spec(record.spec), mlflow, experiment, record.suite_name)
    if target is None:
        fail(
            f"no MLflow tracking server: pass --mlflow URI (or set {URI_ENV}), or declare "
            "spec.tracking.mlflow.trackingURI in the run file",
            EXIT_CONFIG,
        )
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if not Background(target, lambda: log_local_run(db, run_id, target)).finish(run_id):
        raise typer.Exit(EXIT_RUNTIME)
