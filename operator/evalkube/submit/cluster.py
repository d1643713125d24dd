"""The cluster ``evalkube submit`` applies to and watches: lightkube, as the operator uses it.

The kubeconfig is ``--kubeconfig``, else ``$KUBECONFIG`` (its first file that exists), else
``~/.kube/config``, else the in-cluster service account; ``--context`` picks a context.
Objects are applied with server-side apply (field manager ``evalkube-submit``), first as a
server-side dry run of all of them, so a manifest the API server refuses (a CEL rule, the
schema) leaves nothing applied.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.resources.core_v1 import Secret
from lightkube.types import OnErrorAction, OnErrorResult

from evalkube import limits
from evalkube.controller.kube import EvalRunResource
from evalkube.models import ConfigError
from evalkube.submit.plan import FIELD_MANAGER

#: API answers that mean the request was wrong (what a user fixes), not that the cluster failed.
_REFUSALS = (400, 401, 403, 404, 409, 422)


class ClusterUnreachable(RuntimeError):
    """The API server did not answer, or failed (5xx)."""


class Refused(ConfigError):
    """The API server refused a request (``code``: its HTTP status)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def kubeconfig(path: str | None, context: str | None) -> SingleConfig:
    """The configuration to reach the cluster with (see the module's docstring)."""
    candidates = [path] if path else (os.environ.get("KUBECONFIG") or "").split(os.pathsep)
    candidates = [c for c in candidates if c]
    default = Path("~/.kube/config").expanduser()
    try:
        files = [Path(c).expanduser() for c in candidates]
        found = next((f for f in files if f.is_file()), None)
        if found is None and path:
            raise ConfigError(f"--kubeconfig {path}: no such file")
        if found is None and not candidates and default.is_file():
            found = default
        if found is not None:
            single = KubeConfig.from_file(found).get(context)
        else:
            if context is not None:
                raise ConfigError(f"--context {context}: no kubeconfig file to find it in")
            single = KubeConfig.from_service_account().get()
    except KubeConfigError as exc:
        raise ConfigError(
            f"cannot reach a cluster: {exc} (set KUBECONFIG, give --kubeconfig, or run inside a "
            "cluster)"
        ) from None
    assert single is not None
    return single


class Cluster:
    """The few calls ``evalkube submit`` makes."""

    def __init__(self, config: SingleConfig) -> None:
        self.config = config
        self.client = Client(config=config, field_manager=FIELD_MANAGER)

    @property
    def server(self) -> str:
        return str(self.config.cluster.server)

    def close(self) -> None:
        self.client.close()

    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The EvalRun, or ``None`` when there is none of that name."""
        return self._get(EvalRunResource, namespace, name, f"EvalRun {namespace}/{name}")

    def secret_metadata(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret's metadata (never its data), or ``None`` when there is none."""
        found = self._get(Secret, namespace, name, f"Secret {namespace}/{name}")
        return None if found is None else dict(found.get("metadata") or {})

    def _get(self, resource: Any, namespace: str, name: str, what: str) -> dict[str, Any] | None:
        try:
            found: Any = self._call(
                lambda: self.client.get(resource, name, namespace=namespace), what
            )
        except Refused as exc:
            if exc.code == 404:
                return None
            raise
        return dict(found.to_dict())

    def delete_secret(self, namespace: str, name: str) -> None:
        self._call(
            lambda: self.client.delete(Secret, name, namespace=namespace),
            f"Secret {namespace}/{name}",
        )

    def apply(self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False) -> None:
        """Server-side apply each manifest in order (``dry_run``: the API server checks them
        and stores nothing)."""
        for manifest in manifests:
            obj = from_dict(dict(manifest))
            what = f"{manifest['kind']} {manifest['metadata']['name']}"
            self._call(
                lambda obj=obj: self.client.apply(
                    obj, field_manager=FIELD_MANAGER, force=True, dry_run=dry_run
                ),
                what,
            )

    def watch_run(self, namespace: str, name: str) -> Iterator[dict[str, Any] | None]:
        """The EvalRun as it is now, then each time it changes; ``None`` once it is deleted.
        A watch the server ends is re-opened; one that fails is retried with backoff for
        :data:`limits.SUBMIT_WATCH_RETRY_SECONDS` (then :class:`ClusterUnreachable`)."""
        failing_since: list[float] = []

        def retry(error: Exception, count: int) -> OnErrorResult:
            if count == 1:
                failing_since[:] = [time.monotonic()]
            if time.monotonic() - failing_since[0] > limits.SUBMIT_WATCH_RETRY_SECONDS:
                return OnErrorResult(OnErrorAction.RAISE)
            return OnErrorResult(OnErrorAction.RETRY, sleep=min(10.0, 2.0 ** (count - 1)))

        events = self.client.watch(
            EvalRunResource,
            namespace=namespace,
            fields={"metadata.name": name},
            on_error=retry,
        )
        try:
            for event, changed in events:
                obj: Any = changed
                yield None if event == "DELETED" else dict(obj.to_dict())
        except ApiError as exc:
            raise ClusterUnreachable(f"watching EvalRun {namespace}/{name}: {exc}") from None
        except Exception as exc:  # the transport's errors (httpx2) after the retries
            raise ClusterUnreachable(
                f"watching EvalRun {namespace}/{name}: {self.server}: {exc}"
            ) from None

    def _call(self, call: Any, what: str) -> Any:
        try:
            return call()
        except ApiError as exc:
            code = exc.status.code
            if code in _REFUSALS:
                raise Refused(f"{what}: the API server refused it ({code}): {exc}", code) from None
            raise ClusterUnreachable(f"{what}: {self.server} answered {code}: {exc}") from None
        except Exception as exc:  # connection refused, TLS, timeouts (httpx2)
            raise ClusterUnreachable(f"{what}: cannot reach {self.server}: {exc}") from None
