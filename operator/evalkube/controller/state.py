"""The operator's long-lived parts, built once at startup and shared by every handler."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from evalkube.controller.api import ApiServer
from evalkube.controller.kube import EvalSuiteResource, Kube
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunRegistry
from evalkube.controller.run_reconciler import EventSink, RunReconciler
from evalkube.controller.schedule_reconciler import ScheduleReconciler
from evalkube.controller.settings import OperatorSettings
from evalkube.controller.snapshot import check_cluster_suite, image_policy
from evalkube.models.status import condition, merge_conditions, read_status
from evalkube.models.suite import EvalSuiteStatus
from evalkube.store import ResultStore
from evalkube.util.net import parse_listen


@dataclass
class OperatorState:
    """Store, API servers and reconcilers of one operator process."""

    store: ResultStore
    kube: Kube
    reconciler: RunReconciler
    runners: list[web.AppRunner]
    schedules: ScheduleReconciler

    @classmethod
    async def start(
        cls, settings: OperatorSettings, event: EventSink | None = None
    ) -> OperatorState:
        store = await asyncio.to_thread(ResultStore.open, settings.store_url)
        kube = Kube()
        reconciler = RunReconciler(kube, store, RunRegistry(), OperatorMetrics(), settings, event)
        api = ApiServer(
            store,
            reconciler.registry,
            reconciler.metrics,
            read_token=settings.api_token,
            resolve=reconciler.resolve_run,
            on_unit_done=reconciler.unit_done,
        )
        runners = [
            await _serve(api.ingest_app, settings.listen),
            await _serve(api.api_app, settings.api_listen),
        ]
        schedules = ScheduleReconciler(kube, settings, event)
        return cls(store, kube, reconciler, runners, schedules)

    async def suite_status(self, suite: Mapping[str, Any]) -> dict[str, Any]:
        """The EvalSuite's status (as patched) after checking its spec and the ConfigMaps it
        reads."""
        meta = suite["metadata"]
        images = image_policy(self.reconciler.settings)
        check = await check_cluster_suite(
            self.kube, meta["namespace"], suite.get("spec") or {}, images
        )
        generation = meta.get("generation")
        valid = f"{len(check.sources)} programs checked"
        message = valid if check.ok else "; ".join(check.problems)[:4000]
        reason = "Valid" if check.ok else "Invalid"
        cond = condition("Ready", check.ok, reason, message, generation)
        status = EvalSuiteStatus(
            phase="Ready" if check.ok else "Invalid",
            observed_generation=generation,
            suite_version=check.version if check.ok else None,
            conditions=merge_conditions(
                read_status(EvalSuiteStatus, suite.get("status")).conditions, [cond]
            ),
        )
        # a suite that turns Invalid must lose its old version, not keep it: null deletes it
        return {**status.to_wire(), "suiteVersion": status.suite_version}

    async def recheck_suite(self, namespace: str, name: str) -> None:
        """Check the suite again (a ConfigMap it reads changed) and patch its status."""
        suite = await self.kube.suite(namespace, name)
        if suite is not None:
            new = await self.suite_status(suite)
            await self.kube.patch_status(EvalSuiteResource, namespace, name, new)

    async def close(self) -> None:
        await self.reconciler.tracking.close()
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
