"""``ctx``: the grader's only door to models, through the evalkube model bridge proxy.

The proxy holds the credentials and the budgets; the grader never sees an API key. Every
call carries the execution id so the proxy can enforce ``max_model_calls`` per execution
and hand the runner each sample's call count and response ids.
"""

from __future__ import annotations

import json
from functools import cache

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    import http.client
    from typing import Any

EXECUTION_HEADER = "X-Evalkube-Execution"
#: How long a call is sent again while the bridge is restarting: its socket refuses or is
#: missing, or it hung up before answering (the proxy sidecar was killed; the kubelet starts
#: it again within seconds, and 10 s later after a second kill). The restarted proxy counts
#: what the dead one had sent as the execution's ``retries`` (docs/proxy.md, "Resilience").
RESTART_RETRY_SECONDS = 60.0


class ModelCallError(RuntimeError):
    """A model call through ``ctx`` failed (budget exhausted, provider error, no access).

    ``kind`` is the proxy's error type (``budget_exhausted``, ``credentials_rejected``,
    ``upstream_timeout``, ``upstream_unreachable``, ``upstream_error``, ``rate_limited``,
    ``invalid_request``, ...) or ``bridge_unreachable``; ``status`` the proxy's HTTP status.
    """

    def __init__(self, message: str, *, kind: str = "error", status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@cache
def _http() -> tuple[Any, type[Any]]:
    """``http.client`` and a unix-socket connection class, imported on the first model call:
    most graders never make one, and every worker start pays for the import otherwise
    (``http.client`` pulls in the ``email`` package; slow under gVisor)."""
    import http.client
    import socket
    import time

    class UnixHTTPConnection(http.client.HTTPConnection):
        def __init__(self, path: str, timeout: float) -> None:
            super().__init__("localhost", timeout=timeout)
            self._path = path

        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                self._connect(sock)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

        def _connect(self, sock: socket.socket) -> None:
            # A unix socket whose listen backlog is momentarily full refuses at once with
            # EAGAIN, where TCP would retry its SYN: retry the same way, within the timeout.
            deadline = time.monotonic() + min(self.timeout or 30.0, 30.0)
            pause = 0.001
            while True:
                try:
                    sock.connect(self._path)
                    return
                except BlockingIOError:
                    if time.monotonic() + pause > deadline:
                        raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    return http.client, UnixHTTPConnection


class Context:
    """Passed as the grader's ``ctx`` argument when its signature asks for one."""

    __slots__ = ("_enabled", "_endpoint", "_timeout", "execution_id", "task_id")

    def __init__(
        self, endpoint: str | None, execution_id: str, task_id: str, timeout: float = 600.0
    ) -> None:
        self._endpoint = endpoint
        self._enabled = endpoint is not None
        self._timeout = timeout
        self.execution_id = execution_id
        self.task_id = task_id

    def responses_create(self, **request: Any) -> dict[str, Any]:
        """Create a response (Responses API shape); ``model="auto"`` is the run's judge model.

        The result carries ``output_text`` (all output text joined) as the SDKs do.
        """
        response = self._post("/v1/responses", request)
        if "output_text" not in response:
            response["output_text"] = output_text(response)
        return response

    def embeddings_create(self, **request: Any) -> dict[str, Any]:
        """Create embeddings (Embeddings API shape); ``model="auto"`` is the run's model."""
        return self._post("/v1/embeddings", request)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self._enabled or self._endpoint is None:
            raise ModelCallError(
                "model access is disabled for this grader: set `contract: model_backed` "
                "(or `model_access: gateway`) on the task's grader"
            )
        try:
            payload = json.dumps(body).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ModelCallError(
                f"the request is not JSON-serializable: {exc}", kind="invalid_request"
            ) from None
        client = _http()[0]
        deadline = pause = 0.0
        while True:
            conn = self._connection()
            try:
                conn.request(
                    "POST",
                    path,
                    body=payload,
                    headers={
                        "Content-Type": "application/json",
                        EXECUTION_HEADER: self.execution_id,
                    },
                )
                reply = conn.getresponse()
                data = reply.read()
                break
            except TimeoutError:
                raise ModelCallError(
                    f"the model bridge did not answer within {self._timeout:g} s",
                    kind="bridge_unreachable",
                ) from None
            except (OSError, client.HTTPException) as exc:
                # refused or hung up before the answer: the proxy is restarting (its socket
                # missing only counts while it restarts: a stopped proxy removes it)
                restarting = isinstance(exc, (ConnectionError, client.IncompleteRead)) or (
                    bool(deadline) and isinstance(exc, FileNotFoundError)
                )
                if restarting:
                    import time

                    now = time.monotonic()
                    if not deadline:
                        deadline, pause = now + RESTART_RETRY_SECONDS, 0.1
                    if now + pause < deadline:
                        time.sleep(pause)
                        pause = min(pause * 2, 2.0)
                        continue
                waited = f" (sent again for {RESTART_RETRY_SECONDS:g} s)" if restarting else ""
                raise ModelCallError(
                    f"model bridge unreachable at {self._endpoint}: "
                    f"{exc or type(exc).__name__}{waited}",
                    kind="bridge_unreachable",
                ) from None
            finally:
                conn.close()
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {}
        if reply.status >= 400:
            error = decoded.get("error") if isinstance(decoded, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            kind = error.get("type") if isinstance(error, dict) else None
            raise ModelCallError(
                str(message) if message else f"model bridge answered HTTP {reply.status}",
                kind=str(kind) if kind else "error",
                status=reply.status,
            )
        if not isinstance(decoded, dict):
            raise ModelCallError("model bridge answered with a non-object", status=reply.status)
        return decoded

    def _connection(self) -> http.client.HTTPConnection:
        client, unix_connection = _http()
        endpoint = self._endpoint or ""
        if endpoint.startswith("unix:"):
            return unix_connection(endpoint[len("unix:") :], self._timeout)  # type: ignore[no-any-return]
        host = endpoint.split("://", 1)[-1].rstrip("/")
        return client.HTTPConnection(host, timeout=self._timeout)  # type: ignore[no-any-return]


def output_text(response: dict[str, Any]) -> str:
    """Join the ``output_text`` parts of a Responses API ``output`` list."""
    parts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for content in item.get("content") or []:
            if isinstance(content, dict) and content.get("type") == "output_text":
                parts.append(str(content.get("text", "")))
    return "".join(parts)
