"""The Kubernetes API calls the operator makes (lightkube, async), with dict manifests.

Creation is idempotent: an object that already exists (HTTP 409) counts as created, which is
what makes deterministic names restart-safe.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import GenericNamespacedResource, create_namespaced_resource
from lightkube.resources.core_v1 import ConfigMap, Secret, Service
from lightkube.types import CascadeType, PatchType

from evalkube.util import jsonfast

EvalSuiteResource = create_namespaced_resource("evalkube.io", "v1alpha1", "EvalSuite", "evalsuites")
EvalRunResource = create_namespaced_resource("evalkube.io", "v1alpha1", "EvalRun", "evalruns")
EvalScheduleResource = create_namespaced_resource(
    "evalkube.io", "v1alpha1", "EvalSchedule", "evalschedules"
)


#: API requests the operator has in flight at most; the others wait their turn. httpx keeps 20
#: connections open between requests: more at once (a burst of new runs, each pass making its
#: calls) would open and close a TLS connection per request, and past its pool of 100 fail
#: passes with pool timeouts.
REQUESTS_IN_FLIGHT = 20


@functools.cache
def _plain(api_version: str, kind: str) -> type[GenericNamespacedResource]:
    """A dict-backed twin of lightkube's model of ``kind`` (the same API path): a manifest is
    sent and its answer read as plain JSON, without building lightkube's typed model of every
    field and turning it back into a dict (a tenth of the operator's CPU in a burst of runs)."""
    model = resource_registry.load(api_version, kind)
    if model is None:
        raise ValueError(f"no API resource for apiVersion {api_version!r} kind {kind!r}")

    class Plain(GenericNamespacedResource):
        _api_info = model._api_info

    Plain.__name__ = Plain.__qualname__ = kind
    return Plain


class Kube:
    """Thin async wrapper over lightkube for the operator's few object kinds."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient(field_manager="evalkube")
        self._slots = asyncio.Semaphore(REQUESTS_IN_FLIGHT)
        self._shared_reads: dict[tuple[str, str], asyncio.Future[dict[str, Any] | None]] = {}
        """``(namespace, suite) -> its read not sent yet`` (see :meth:`suite`)."""

    async def close(self) -> None:
        await self.client.close()

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create ``manifest``; ``False`` when it already existed."""
        return await self.create_object(manifest) is not None

    async def create_object(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create ``manifest``; the object as created (with its uid), ``None`` when it
        already existed."""
        plain = _plain(manifest["apiVersion"], manifest["kind"]).from_dict(dict(manifest))
        created = await self._request(lambda: self.client.create(plain), 409)
        return None if created is None else dict(created)

    async def _request(
        self,
        call: Callable[[], Awaitable[Any]],
        absent: int,
        sending: Callable[[], None] | None = None,
    ) -> Any:
        """``call()`` within the bound on requests in flight; ``None`` when the API server
        answers ``absent`` (409: it existed; 404: it does not). ``sending()`` runs once the
        request has its slot, right before it is sent."""
        try:
            async with self._slots:
                if sending is not None:
                    sending()
                return await call()
        except ApiError as exc:
            if exc.status.code == absent:
                return None
            raise

    async def create_or_update_secret(self, manifest: Mapping[str, Any]) -> None:
        """Create the Secret ``manifest``, or merge its data into the existing one (never read:
        the operator has no ``get`` on Secrets)."""
        if await self.create(manifest):
            return
        meta = manifest["metadata"]
        data = {"stringData": dict(manifest.get("stringData") or {})}
        await self._merge_patch(Secret, meta["namespace"], meta["name"], data)

    async def patch_status(
        self, kind: Any, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge ``status`` into the status subresource of an evalkube object."""
        await self._merge_patch(kind.Status, namespace, name, {"status": status})

    async def _merge_patch(
        self, kind: Any, namespace: str, name: str, patch: dict[str, Any]
    ) -> None:
        async with self._slots:
            await self.client.patch(
                kind, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )

    async def service_cluster_ip(self, namespace: str, name: str) -> str | None:
        """The Service's ClusterIP, or ``None`` when it does not exist or has none."""
        service = await self._get(Service, namespace, name)
        ip = ((service or {}).get("spec") or {}).get("clusterIP")
        return None if not ip or ip == "None" else str(ip)

    async def _get(
        self, kind: Any, namespace: str, name: str, sending: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        """The object, or ``None`` when it does not exist (404)."""
        found = await self._request(
            lambda: self.client.get(kind, name, namespace=namespace), 404, sending
        )
        return None if found is None else dict(found.to_dict())

    async def config_map_value(self, namespace: str, name: str, key: str) -> str | None:
        data = await self.config_map_data(namespace, name)
        return None if data is None else data.get(key)

    async def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        config_map = await self._get(ConfigMap, namespace, name)
        return None if config_map is None else dict(config_map.get("data") or {})

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """One key of a Secret, decoded; ``None`` when the Secret or key does not exist. Only
        the Secrets of a run's ``spec.tracking`` are read, and the chart's RBAC names them."""
        secret = await self._get(Secret, namespace, name)
        encoded = ((secret or {}).get("data") or {}).get(key)
        return None if encoded is None else base64.b64decode(encoded).decode("utf-8", "replace")

    async def suite(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The suite as the API server holds it now (a copy of its own to each caller).

        Callers waiting for a request slot share one read: it is sent after each of them
        asked, so it is as fresh as a read of their own. A burst of new runs of one suite
        (every run reads its suite once) then reads it about once per wait for a slot, not
        once per run; a caller that comes once the read is sent waits for a read of its own.
        """
        key = (namespace, name)
        pending = self._shared_reads.get(key)
        if pending is None:

            def sent(*_: Any) -> None:  # later callers must not take a read sent before they asked
                if self._shared_reads.get(key) is pending:
                    del self._shared_reads[key]

            read = self._get(EvalSuiteResource, namespace, name, sent)
            pending = self._shared_reads[key] = asyncio.ensure_future(read)
            pending.add_done_callback(sent)  # also when it failed before it was sent
            # every caller may have been cancelled: nobody else retrieves its error
            pending.add_done_callback(lambda done: done.cancelled() or done.exception())
        # shielded: one caller cancelled (its run deleted) leaves the others' read alone;
        # copied through JSON (the suite is JSON): a quarter of deepcopy's time on a large one
        found = await asyncio.shield(pending)
        copied: dict[str, Any] | None = jsonfast.loads(jsonfast.dumps(found))
        return copied

    async def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(EvalRunResource, namespace, name)

    async def delete_run(self, namespace: str, name: str) -> None:
        """Delete an EvalRun and, in the background, what it owns; gone already is fine."""
        await self._request(
            lambda: self.client.delete(
                EvalRunResource, name, namespace=namespace, cascade=CascadeType.BACKGROUND
            ),
            404,
        )
