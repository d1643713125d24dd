"""A sandbox that is already running elsewhere: the ``grader`` container of a work-unit pod.

The runner connects to the grader container's unix socket; each connection is a fresh
worker (``evalkube_sandbox.serve``). Killing the worker is hanging up: the supervisor in
the grader container then kills the worker's process group. Isolation (gVisor, no token,
no secrets, read-only root) comes from the Pod spec, not from this process.
"""

from __future__ import annotations

import io
import socket
import subprocess
from contextlib import suppress
from typing import IO, ClassVar

import tenacity

from evalkube.sandbox.backends import (
    SandboxBackend,
    SandboxUnavailable,
    SpawnRequest,
    WorkerProcess,
)


class _Connection:
    """The subset of ``subprocess.Popen`` the session uses, over a socket."""

    pid = -1

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stdin: IO[bytes] = sock.makefile("wb")
        self.stdout: IO[bytes] = sock.makefile("rb")
        self.stderr: IO[bytes] = io.BufferedReader(io.BytesIO(b""))  # logs go to the container

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired("grader-container", timeout or 0)


class SocketWorker(WorkerProcess):
    """A worker behind a unix socket; :meth:`kill` hangs up."""

    def __init__(self, sock: socket.socket, model_endpoint: str | None) -> None:
        self.connection = _Connection(sock)
        super().__init__(self.connection, None, model_endpoint=model_endpoint)  # type: ignore[arg-type]

    def exit_code(self) -> int | None:
        return None

    def kill(self) -> None:
        with suppress(OSError):
            self.connection.sock.shutdown(socket.SHUT_RDWR)
        self.close()

    def close(self) -> None:
        for stream in (self.connection.stdin, self.connection.stdout):
            with suppress(OSError):
                stream.close()
        with suppress(OSError):
            self.connection.sock.close()
        super().close()


class PodSocketBackend(SandboxBackend):
    """Connects to ``path`` (the grader container's socket) for each worker."""

    name: ClassVar[str] = "pod"
    isolating: ClassVar[bool] = True
    mounts_environment: ClassVar[bool] = False

    def __init__(self, path: str = "", *, connect_timeout: float = 120.0) -> None:
        self.path = path
        self.connect_timeout = connect_timeout

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "only inside a work-unit pod (evalkube unit --worker unix:PATH)"

    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        """A worker on a new connection. The grader container may still be starting, so a
        refused or missing socket is retried every 0.2 s for up to ``connect_timeout`` s."""
        connecting = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(OSError),
            wait=tenacity.wait_fixed(0.2),
            stop=tenacity.stop_after_delay(self.connect_timeout),
            reraise=True,
        )
        try:
            sock = connecting(_connect, self.path)
        except OSError as exc:
            raise SandboxUnavailable(
                f"grader container socket {self.path} is not answering: {exc}"
            ) from None
        endpoint = request.model_endpoint if request else None
        return SocketWorker(sock, endpoint)

    def describe(self) -> str:
        return "pod (gVisor grader container)"


def _connect(path: str) -> socket.socket:
    """A socket connected to ``path`` (closed again when connecting fails)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
