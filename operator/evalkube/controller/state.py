"""The operator's long-lived parts, built once at startup and shared by every handler."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from evalkube._net import parse_listen
from evalkube.controller.api import ApiServer
from evalkube.controller.kube import Kube
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunRegistry
from evalkube.controller.runs import EventSink, RunReconciler
from evalkube.controller.schedules import ScheduleReconciler
from evalkube.controller.settings import OperatorSettings
from evalkube.store import ResultStore


@dataclass
class OperatorState:
    """Store, registry, metrics, API server and reconcilers of one operator process."""

    settings: OperatorSettings
    store: ResultStore
    registry: RunRegistry
    metrics: OperatorMetrics
    kube: Kube
    reconciler: RunReconciler
    runners: list[web.AppRunner]
    schedules: ScheduleReconciler

    @classmethod
    async def start(
        cls, settings: OperatorSettings, event: EventSink | None = None
    ) -> OperatorState:
        store = await asyncio.to_thread(ResultStore.open, settings.store_url)
        registry = RunRegistry()
        metrics = OperatorMetrics()
        kube = Kube()
        reconciler = RunReconciler(kube, store, registry, metrics, settings, event)
        api = ApiServer(
            store,
            registry,
            metrics,
            read_token=settings.api_token,
            resolve=reconciler.resolve_run,
        )
        runners = [
            await _serve(api.ingest_app, settings.listen),
            await _serve(api.api_app, settings.api_listen),
        ]
        schedules = ScheduleReconciler(kube, settings, event)
        return cls(settings, store, registry, metrics, kube, reconciler, runners, schedules)

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
        await self.kube.close()
        await asyncio.to_thread(self.store.close)


async def _serve(app: web.Application, listen: str) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    address = parse_listen(listen, default_host="0.0.0.0")
    if isinstance(address, str):
        raise ValueError(f"{listen!r}: the operator listens on host:port only")
    await web.TCPSite(runner, *address).start()
    return runner


def suite_status(check: Any, generation: int | None, old: Mapping[str, Any]) -> dict[str, Any]:
    """EvalSuite status from a :class:`~evalkube.controller.snapshot.SuiteCheck`."""
    from evalkube.controller.runs import condition, merge_conditions
    from evalkube.models.suite import EvalSuiteStatus

    if check.ok:
        cond = condition(
            "Ready", True, "Valid", f"{len(check.sources)} programs checked", generation
        )
    else:
        cond = condition("Ready", False, "Invalid", "; ".join(check.problems)[:4000], generation)
    status = EvalSuiteStatus.model_validate(
        {
            "phase": "Ready" if check.ok else "Invalid",
            "observedGeneration": generation,
            "suiteVersion": check.version if check.ok else None,
            "conditions": merge_conditions(list(old.get("conditions") or []), [cond]),
        }
    )
    # a suite that turns Invalid must lose its old version, not keep it: null deletes it
    return {**status.to_wire(), "suiteVersion": status.suite_version}
