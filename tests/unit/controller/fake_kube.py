"""An in-memory stand-in for :class:`evalkube.controller.kube.Kube`: exactly the calls the
reconcilers make, over dicts kept by kind, namespace and name.

It behaves like the API server where the reconcilers depend on it: ``create`` of an existing
object answers ``False`` (HTTP 409), status patches merge, and :meth:`FakeKube.job_index`
shows the Jobs as kopf's Job index would.
Tests play the cluster by editing :attr:`FakeKube.objects` (a Job completing, failing, being
suspended by Kueue).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from evalkube.controller.kube import EvalRunResource
from evalkube.controller.run_decisions import JobState, job_index_entry

Key = tuple[str, str, str]
"""``(kind, namespace, name)``."""


class FakeKube:
    """In-memory objects plus a log of the status patches the reconciler wrote itself."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.service_ips: dict[tuple[str, str], str] = {}
        #: Status patches larger than this (bytes of JSON) are refused as the API server
        #: refuses an object past etcd's request limit (HTTP 500); ``None``: no limit.
        self.status_bytes_max: int | None = None
        #: Status patches are refused with this HTTP code until it is cleared (``None``).
        self.refuse_status: int | None = None
        #: Status patches holding results are refused as too large (HTTP 500).
        self.refuse_results = False
        #: Every write in order: ``("create", kind, name)`` of what was created (a conflict is
        #: not logged), ``("status", sorted keys)`` of each status patch that was written.
        self.writes: list[tuple[Any, ...]] = []

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
        self.writes.append(("create", manifest["kind"], meta["name"]))
        return copy.deepcopy(self.objects[key])

    async def create_or_update_secret(self, manifest: Mapping[str, Any]) -> None:
        if not await self.create(manifest):
            await self.overwrite_secret(manifest)

    async def overwrite_secret(self, manifest: Mapping[str, Any]) -> None:
        meta = manifest["metadata"]
        secret = self.objects[("Secret", meta["namespace"], meta["name"])]
        secret.setdefault("stringData", {}).update(manifest.get("stringData") or {})

    async def patch_status(
        self, kind: Any, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        assert kind is EvalRunResource, "the run reconciler patches EvalRun statuses only"
        size = len(json.dumps(status))
        if self.refuse_status is not None:
            raise api_error(self.refuse_status, "the server is currently unable to handle it")
        too_large = self.status_bytes_max is not None and size > self.status_bytes_max
        if too_large or (self.refuse_results and status.get("results")):
            raise api_error(500, "etcdserver: request is too large")
        self.status_patches.append((namespace, name, dict(status)))
        self.writes.append(("status", *sorted(status)))
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

    def job_index(self) -> dict[tuple[str, str], list[tuple[str, JobState]]]:
        """What kopf's Job index holds: the entries ``handlers.unit_jobs`` makes of each Job."""
        index: dict[tuple[str, str], list[tuple[str, JobState]]] = {}
        for (kind, ns, _), job in self.objects.items():
            if kind != "Job":
                continue
            meta = job["metadata"]
            labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
            for key, entry in job_index_entry(ns, labels, annotations, job).items():
                index.setdefault(key, []).append(entry)
        return index


class LiveJobIndex(Mapping[tuple[str, str], list[tuple[str, JobState]]]):
    """The Job index as kopf keeps it: always the Jobs that exist now."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    def __getitem__(self, key: tuple[str, str]) -> list[tuple[str, JobState]]:
        return self.kube.job_index()[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.kube.job_index())

    def __len__(self) -> int:
        return len(self.kube.job_index())


def api_error(code: int, message: str) -> ApiError:
    """The error lightkube raises for an API server answer of ``code``."""
    return ApiError(status=Status(code=code, message=message, reason="", status="Failure"))
