"""Log finished EvalRuns to MLflow (``spec.tracking.mlflow``), in the background.

:meth:`RunTracking.finished` is the one call ``RunReconciler._finish`` makes: it returns the
``Tracked=Unknown`` condition the final status carries and starts a task that reads the
credentials (Secrets only the operator reads, never a work pod), logs the run with the MLflow
client in a thread (kopf's event loop is never blocked) within bounded retries, and then sets
``Tracked`` to ``True`` (the MLflow run's page) or ``False`` with the reason. The run's phase
never depends on it.

The HTML report is rendered by ``evalkube.reporting`` (above the controller): the
``evalkube operator`` command hands its renderer over with :func:`use_report`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lightkube import ApiError
from pydantic import ValidationError

from evalkube.controller import names
from evalkube.controller.kube import EvalRunResource, Kube
from evalkube.controller.schedule_decisions import LABEL_SCHEDULE
from evalkube.controller.settings import OperatorSettings
from evalkube.models import Condition, EvalRunSpec, EvalRunStatus
from evalkube.models.refs import SecretKeyRef
from evalkube.models.status import condition, merge_conditions, read_status
from evalkube.models.tracking import MlflowTrackingSpec
from evalkube.store import ResultStore
from evalkube.tracking import (
    Artifact,
    MlflowTarget,
    RunFacts,
    TrackingFailed,
    describe,
    log_run,
)
from evalkube.tracking.artifacts import run_artifacts
from evalkube.tracking.mlflow_log import shown_uri

CONDITION = "Tracked"
REPORT = "report.html"
#: Renders a run's HTML report from the store (``evalkube.reporting.report.render_report``).
ReportRenderer = Callable[[ResultStore, str], str]
EventSink = Callable[[Mapping[str, Any], str, str, str], None]
_report: ReportRenderer | None = None
_log = logging.getLogger(__name__)


def use_report(renderer: ReportRenderer | None) -> None:
    """Log ``report.html`` with every tracked run, rendered by ``renderer``."""
    global _report
    _report = renderer


def experiment_name(spec: MlflowTrackingSpec, body: Mapping[str, Any], suite: str) -> str:
    """The declared experiment, else one per EvalSchedule (its runs plot over time), else one
    per suite, all under ``evalkube/<namespace>/``."""
    if spec.experiment:
        return spec.experiment
    meta = body["metadata"]
    schedule = (meta.get("labels") or {}).get(LABEL_SCHEDULE)
    return f"evalkube/{meta['namespace']}/{schedule or suite}"


class RunTracking:
    """The operator's MLflow logging: one background task per finished run."""

    def __init__(
        self,
        kube: Kube,
        store: ResultStore,
        settings: OperatorSettings,
        event: EventSink,
    ) -> None:
        self.kube, self.store, self.settings, self.event = kube, store, settings, event
        self._tasks: set[asyncio.Task[None]] = set()
        self._active: set[tuple[str, str]] = set()
        """Runs being logged now (``resume`` leaves them be)."""
        self._stopping = threading.Event()
        """Set when the operator stops: logging threads end before their next try."""

    def finished(
        self,
        body: Mapping[str, Any],
        spec: EvalRunSpec,
        status: EvalRunStatus,
        run_id: str,
        suite: str,
    ) -> list[Condition]:
        """Start logging the run when it asks for it; the condition its final status carries."""
        tracking = spec.tracking.mlflow if spec.tracking is not None else None
        if tracking is None:
            return []
        meta = body["metadata"]
        generation = meta.get("generation")
        facts = RunFacts(
            run_id=run_id,
            suite=suite,
            suite_version=status.suite_version or "",
            phase=status.phase,
            spec=spec,
            results=list(status.results),
            gate=status.gate,
            sandbox="pod (gVisor)" if self.settings.runtime_class else "pod",
            run_name=meta["name"],
            origin=_origin(body),
        )
        key = (meta["namespace"], meta["name"])
        self._active.add(key)
        task = asyncio.create_task(self._track(body, tracking, facts, generation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._active.discard(key))
        message = f"logging to MLflow at {shown_uri(tracking.tracking_uri)}"
        logging = condition(CONDITION, False, "Logging", message, generation)
        return [logging.model_copy(update={"status": "Unknown"})]

    def resume(self, body: Mapping[str, Any], status: EvalRunStatus) -> None:
        """A finished run whose logging began and never ended (``Tracked=Unknown``: the
        operator stopped meanwhile) is logged again; the MLflow run is found by its tag."""
        meta = body["metadata"]
        if (meta["namespace"], meta["name"]) in self._active:
            return
        found = next((c for c in status.conditions if c.type == CONDITION), None)
        if found is None or found.status != "Unknown":
            return
        try:
            spec = EvalRunSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return  # the API server's schema holds it; nothing to log with
        run_id = names.run_id(meta["namespace"], meta["name"], meta["uid"])
        suite = spec.suite_ref.name if spec.suite_ref is not None else ""
        self.finished(body, spec, status, run_id, suite)

    async def close(self) -> None:
        """Cancel logging still under way (the operator stops)."""
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _track(
        self,
        body: Mapping[str, Any],
        spec: MlflowTrackingSpec,
        facts: RunFacts,
        generation: int | None,
    ) -> None:
        meta = body["metadata"]
        try:
            target = await self._target(meta["namespace"], spec, body, facts.suite)
            artifacts = run_artifacts(self.store, facts.run_id, facts.results)
            renderer = _report
            if renderer is not None:
                artifacts.insert(0, _report_artifact(renderer, self.store, facts.run_id))
            logged = await asyncio.to_thread(
                log_run,
                target,
                facts.run_id,
                facts.phase,
                describe(facts),
                artifacts,
                attempts=self.settings.mlflow_attempts,
                cancel=self._stopping,
            )
            message = (
                f"MLflow run {logged.run_id} in experiment {target.experiment!r}: {logged.url}"
            )
            result = condition(CONDITION, True, "Logged", message, generation)
        except TrackingFailed as exc:
            result = condition(CONDITION, False, "TrackingFailed", str(exc), generation)
            self.event(body, "Warning", "TrackingFailed", str(exc))
        except Exception as exc:  # never the run's failure; said on the run
            _log.exception("tracking EvalRun %s/%s failed", meta["namespace"], meta["name"])
            message = f"MLflow logging failed: {type(exc).__name__}: {exc}"
            result = condition(CONDITION, False, "TrackingFailed", message, generation)
        await self._set_condition(meta["namespace"], meta["name"], result)

    async def _target(
        self, namespace: str, spec: MlflowTrackingSpec, body: Mapping[str, Any], suite: str
    ) -> MlflowTarget:
        token = await self._secret(namespace, spec.token_secret_ref, "tokenSecretRef")
        password = await self._secret(namespace, spec.password_secret_ref, "passwordSecretRef")
        return MlflowTarget(
            spec.tracking_uri,
            experiment_name(spec, body, suite),
            token=token,
            username=spec.username,
            password=password,
        )

    async def _secret(self, namespace: str, ref: SecretKeyRef | None, field: str) -> str | None:
        if ref is None:
            return None
        where = f"spec.tracking.mlflow.{field}: Secret {namespace}/{ref.name}"
        try:
            value = await self.kube.secret_value(namespace, ref.name, ref.key)
        except ApiError as exc:
            if exc.status.code == 403:
                raise TrackingFailed(
                    f"{where}: the operator may not read it; name it in the chart's "
                    "rbac.trackingSecrets"
                ) from None
            raise TrackingFailed(f"{where}: {exc.status.message}") from None
        if value is None:
            raise TrackingFailed(f"{where} has no key {ref.key!r}")
        return value

    async def _set_condition(self, namespace: str, name: str, result: Condition) -> None:
        """Merge ``result`` into the run's conditions once its final status is there (the pass
        that finished the run patches it right after ``_finish``)."""
        for _ in range(30):
            body = await self.kube.run(namespace, name)
            if body is None:
                return  # deleted meanwhile
            status = read_status(EvalRunStatus, body.get("status"))
            if status.phase in ("Succeeded", "Failed"):
                merged = merge_conditions(status.conditions, [result], keep_others=True)
                wire = [c.to_wire() for c in merged]
                await self.kube.patch_status(EvalRunResource, namespace, name, {"conditions": wire})
                return
            await asyncio.sleep(1)
        _log.warning("EvalRun %s/%s never showed its final status: %s", namespace, name, result)


def _report_artifact(renderer: ReportRenderer, store: ResultStore, run_id: str) -> Artifact:
    def write(path: Path) -> None:
        path.write_text(renderer(store, run_id), encoding="utf-8", errors="backslashreplace")

    return Artifact(REPORT, write)


def _origin(body: Mapping[str, Any]) -> dict[str, str]:
    meta = body["metadata"]
    origin = {"namespace": meta["namespace"], "evalrun": meta["name"]}
    schedule = (meta.get("labels") or {}).get(LABEL_SCHEDULE)
    if schedule:
        origin["schedule"] = schedule
    return origin
