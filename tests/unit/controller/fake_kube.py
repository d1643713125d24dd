"""An in-memory stand-in for :class:`evalkube.controller.kube.Kube`: exactly the calls the
reconcilers make, over dicts kept by kind, namespace and name.

It behaves like the API server where the reconcilers depend on it: ``create`` of an existing
object answers ``False`` (HTTP 409), status patches merge, Jobs are listed by the run label.
Tests play the cluster by editing :attr:`FakeKube.objects` (a Job completing, failing, being
suspended by Kueue).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from evalkube.controller import names

Key = tuple[str, str, str]
"""``(kind, namespace, name)``."""


class FakeKube:
    """In-memory objects plus a log of the status patches the reconciler wrote itself."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.service_ips: dict[tuple[str, str], str] = {}

    # -- helpers for tests ------------------------------------------------------------------
    def put(self, manifest: Mapping[str, Any]) -> None:
        meta = manifest["metadata"]
        self.objects[(manifest["kind"], meta.get("namespace", ""), meta["name"])] = copy.deepcopy(
            dict(manifest)
        )

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for (k, _, _), obj in self.objects.items() if k == kind]

    # -- the Kube interface ------------------------------------------------------------------
    async def create(self, manifest: Mapping[str, Any]) -> bool:
        return await self.create_object(manifest) is not None

    async def create_object(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = manifest["metadata"]
        key = (manifest["kind"], meta.get("namespace", ""), meta["name"])
        if key in self.objects:
            return None
        self.put(manifest)
        return copy.deepcopy(self.objects[key])

    async def create_or_update_secret(self, manifest: Mapping[str, Any]) -> None:
        if not await self.create(manifest):
            await self.overwrite_secret(manifest)

    async def overwrite_secret(self, manifest: Mapping[str, Any]) -> None:
        meta = manifest["metadata"]
        secret = self.objects[("Secret", meta["namespace"], meta["name"])]
        secret.setdefault("stringData", {}).update(manifest.get("stringData") or {})

    async def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status_patches.append((namespace, name, dict(status)))
        run = self.objects.get(("EvalRun", namespace, name))
        if run is not None:
            run.setdefault("status", {}).update(status)

    async def service_cluster_ip(self, namespace: str, name: str) -> str | None:
        return self.service_ips.get((namespace, name))

    async def config_map_value(self, namespace: str, name: str, key: str) -> str | None:
        data = await self.config_map_data(namespace, name)
        return None if data is None else data.get(key)

    async def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self.objects.get(("ConfigMap", namespace, name))
        return None if found is None else dict(found.get("data") or {})

    async def suite(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(("EvalSuite", namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(("EvalRun", namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def unit_jobs(self, namespace: str, run_name: str) -> dict[str, dict[str, Any]]:
        jobs = {}
        for (kind, ns, _), job in self.objects.items():
            meta = job["metadata"]
            if kind != "Job" or ns != namespace:
                continue
            if (meta.get("labels") or {}).get(names.LABEL_RUN) != run_name:
                continue
            unit_id = (meta.get("annotations") or {}).get(names.ANNOTATION_UNIT_ID)
            if unit_id:
                jobs[unit_id] = copy.deepcopy(job)
        return jobs
