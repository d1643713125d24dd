"""A client of the model bridge's control listener (the trusted runner's side).

The pod runner drives its sidecar through it, and :class:`~evalkube.proxy.native.NativeBridge`
drives its child binary through it: the same four calls the in-process
:class:`~evalkube.proxy.bridge.ModelBridge` offers as methods (together they make
:class:`evalkube.engine.driver.BridgeControl`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from evalkube import limits
from evalkube.proxy.bridge_base import CONTROL_TIMEOUT


def restart_pauses(seconds: float = limits.BRIDGE_RESTART_RETRY_SECONDS) -> Iterator[float]:
    """The pauses before each call sent again while the bridge's sidecar restarts: 0.1 s
    doubling to 2 s, none that would end past ``seconds`` from now."""
    deadline, pause = time.monotonic() + seconds, 0.1
    while time.monotonic() + pause < deadline:
        yield pause
        pause = min(pause * 2, 2.0)


class ControlClient:
    """Budgets, execution tokens and usage of one bridge, over ``unix:/path`` or ``http://``."""

    def __init__(
        self,
        control_endpoint: str,
        *,
        grader_endpoint: str | None = None,
        restart_retry_seconds: float = limits.BRIDGE_RESTART_RETRY_SECONDS,
    ) -> None:
        """``grader_endpoint``: where this bridge's graders reach it (``endpoint``);
        ``restart_retry_seconds``: how long a call is sent again while the bridge restarts
        (a pod's sidecar; 0 for a child process that nobody restarts)."""
        self.restart_retry_seconds = restart_retry_seconds
        self.endpoint = grader_endpoint
        unix = control_endpoint.startswith("unix:")
        transport = (
            httpx.HTTPTransport(uds=control_endpoint.removeprefix("unix:")) if unix else None
        )
        base = "http://bridge" if unix else control_endpoint
        self._client = httpx.Client(base_url=base, transport=transport, timeout=CONTROL_TIMEOUT)

    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int
    ) -> None:
        """Serve ``unit_id`` with fresh counters; every open token is closed."""
        self._call(
            "PUT",
            "/evalkube/v1/budget",
            {
                "unit_id": unit_id,
                "max_calls_per_execution": max_calls_per_execution,
                "planned_executions": planned_executions,
            },
        )

    def open_executions(self, tokens: Iterable[str]) -> None:
        """Let graders call models with ``tokens`` until their usage is taken."""
        self._call("POST", "/evalkube/v1/executions:open", {"tokens": list(tokens)})

    def take_usage(self, execution_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids``, closing those tokens."""
        taken: dict[str, dict[str, Any]] = self._call(
            "POST", "/evalkube/v1/usage:take", {"execution_ids": list(execution_ids)}
        )
        return taken

    def budget(self) -> dict[str, object]:
        snapshot: dict[str, object] = self._call("GET", "/evalkube/v1/budget")
        return snapshot

    def metrics(self) -> str:
        """The bridge's Prometheus exposition (served on the control listener only)."""
        return self._send("GET", "/metrics").text

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return self._send(method, path, body).json()

    def _send(self, method: str, path: str, body: Any = None) -> httpx.Response:
        # While the sidecar restarts its socket refuses: nothing was sent, so any call is sent
        # again (its journal restores what the calls before had set); an idempotent one also
        # when the dead process hung up before answering.
        again: tuple[type[Exception], ...] = (httpx.ConnectError,)
        if method in ("GET", "PUT"):
            again = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)
        pauses = restart_pauses(self.restart_retry_seconds)
        while True:
            try:
                response = self._client.request(method, path, json=body)
                break
            except again:
                pause = next(pauses, None)
                if pause is None:
                    raise
                time.sleep(pause)
        if response.status_code >= 400:
            raise ControlError(method, path, response)
        return response


class ControlError(RuntimeError):
    """The bridge refused a control call; the message carries its explanation."""

    def __init__(self, method: str, path: str, response: httpx.Response) -> None:
        try:
            detail = response.json().get("error", {}).get("message", "")
        except ValueError:
            detail = response.text[:300]
        super().__init__(
            f"model bridge control {method} {path} answered HTTP {response.status_code}: {detail}"
        )
        self.status = response.status_code
