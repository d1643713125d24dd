"""A sandbox that is already running elsewhere: the ``grader`` container of a work-unit pod.

The runner listens on a unix socket in a volume the grader container mounts read-only and
accepts exactly one connection, from the grader container's supervisor
(:mod:`evalkube_sandbox.serve`), made before any grader code exists; then it stops
listening. Every worker afterwards is one end of a socket pair the runner makes and passes
over that connection: the runner never dials a path again, so nothing a grader binds or
renames in a shared folder is ever talked to. Ending a worker ends every process of the grader
container; the supervisor says how it ended (its exit code, "out of memory", its stderr).
Isolation (gVisor, no token, no secrets, read-only root) comes from the Pod spec.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import IO, Any, ClassVar

from evalkube.sandbox.backends import (
    SandboxBackend,
    SandboxUnavailable,
    SpawnRequest,
    WorkerProcess,
)

#: Mode of the runner's socket: its user and group (the grader's group: it must connect).
SOCKET_MODE = 0o660
#: Seconds the runner waits for the supervisor to say a worker started, or ended.
SUPERVISOR_ANSWER_SECONDS = 30.0


class _Ending:
    """What the supervisor said of one worker."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()
        self.code: int | None = None
        self.reason = ""
        self.stderr = ""


class SupervisorLink:
    """The runner's one connection to the grader container's supervisor."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid: int | None = None
        self.closed_reason = ""
        self._workers: dict[int, _Ending] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        reader = sock.makefile("rb")
        hello = self._line(reader)
        if not isinstance(hello, dict) or hello.get("t") != "hello":
            sock.close()
            raise SandboxUnavailable(f"the grader container's supervisor said {hello!r}")
        self.pid = hello.get("pid")
        self._thread = threading.Thread(
            target=self._read, args=(reader,), name="evalkube-supervisor", daemon=True
        )
        self._thread.start()

    @staticmethod
    def _line(reader: IO[bytes]) -> Any:
        line = reader.readline(1_000_000)
        return json.loads(line) if line.strip() else None

    def _read(self, reader: IO[bytes]) -> None:
        try:
            while (message := self._line(reader)) is not None:
                if not isinstance(message, dict):
                    continue
                ending = self._workers.get(message.get("id", -1))
                if ending is None:
                    continue
                if message.get("t") == "started":
                    ending.started.set()
                elif message.get("t") == "ended":
                    ending.code = message.get("code")
                    ending.reason = str(message.get("reason") or "")
                    ending.stderr = str(message.get("stderr") or "")
                    ending.ended.set()
        except (OSError, ValueError):
            pass
        self.closed_reason = "the grader container's supervisor closed its connection"
        for ending in list(self._workers.values()):
            if not ending.ended.is_set():
                ending.reason = ending.reason or self.closed_reason
                ending.ended.set()
            ending.started.set()

    def spawn(self) -> tuple[socket.socket, int, _Ending]:
        """A new worker: the runner's end of its channel, its id and its ending."""
        if self.closed_reason:
            raise SandboxUnavailable(
                f"{self.closed_reason}; a work-unit pod never reconnects (a grader could be "
                "listening in its place): the unit's Job retries it in a fresh pod"
            )
        mine, theirs = socket.socketpair()
        worker_id = next(self._ids)
        ending = self._workers[worker_id] = _Ending()
        try:
            with self._lock:
                message = json.dumps({"op": "spawn", "id": worker_id}).encode() + b"\n"
                socket.send_fds(self.sock, [message], [theirs.fileno()])
        except OSError as exc:
            mine.close()
            raise SandboxUnavailable(f"the grader container's supervisor is gone: {exc}") from None
        finally:
            theirs.close()
        if not ending.started.wait(SUPERVISOR_ANSWER_SECONDS) or self.closed_reason:
            mine.close()
            raise SandboxUnavailable(
                self.closed_reason or "the grader container's supervisor did not start a worker"
            )
        return mine, worker_id, ending

    def end(self, worker_id: int) -> None:
        """Ask the supervisor to end a worker (and everything else in its container)."""
        with self._lock, contextlib.suppress(OSError):
            self.sock.sendall(json.dumps({"op": "end", "id": worker_id}).encode() + b"\n")

    def forget(self, worker_id: int) -> None:
        self._workers.pop(worker_id, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class _Connection:
    """The subset of ``subprocess.Popen`` the session uses, over a socket."""

    pid = -1

    def __init__(self, sock: socket.socket, ending: _Ending) -> None:
        self.sock = sock
        self.ending = ending
        self.stdin: IO[bytes] = sock.makefile("wb")
        self.stdout: IO[bytes] = sock.makefile("rb")
        read_end, write_end = os.pipe()  # the supervisor hands the worker's stderr over once
        os.close(write_end)
        self.stderr: IO[bytes] = os.fdopen(read_end, "rb")

    def poll(self) -> int | None:
        return self.ending.code if self.ending.ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.ending.ended.wait(timeout):
            raise subprocess.TimeoutExpired("grader-container", timeout or 0)
        return self.ending.code if self.ending.code is not None else -9


class SocketWorker(WorkerProcess):
    """A worker in the grader container; :meth:`kill` ends it and everything it started."""

    def __init__(
        self, link: SupervisorLink, sock: socket.socket, worker_id: int, ending: _Ending, **kw: Any
    ) -> None:
        self.link = link
        self.worker_id = worker_id
        self.connection = _Connection(sock, ending)
        super().__init__(self.connection, None, **kw)  # type: ignore[arg-type]

    def exit_reason(self, code: int | None) -> str | None:
        ending = self.connection.ending
        tail = ending.stderr.strip().splitlines()[-3:]
        reason = ending.reason or super().exit_reason(code) or ""
        return "; ".join(part for part in (reason, " | ".join(tail)) if part) or None

    def kill(self) -> None:
        if self._closed:
            return
        self.link.end(self.worker_id)
        with contextlib.suppress(OSError):
            self.connection.sock.shutdown(socket.SHUT_RDWR)
        # the next worker starts once this one and all it left are gone
        self.connection.ending.ended.wait(SUPERVISOR_ANSWER_SECONDS)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.sock.close()
        self.link.forget(self.worker_id)
        super().close()


class PodSocketBackend(SandboxBackend):
    """Workers from the grader container's supervisor, which connects once to ``path``."""

    name: ClassVar[str] = "pod"
    isolating: ClassVar[bool] = True
    mounts_environment: ClassVar[bool] = False

    def __init__(self, path: str = "", *, connect_timeout: float = 120.0) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self._link: SupervisorLink | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "only inside a work-unit pod (evalkube unit --worker unix:PATH)"

    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        if self._link is None:
            self._link = self._accept()
        sock, worker_id, ending = self._link.spawn()
        endpoint = request.model_endpoint if request else None
        rlimits = request.limits.worker_rlimits() if request else None
        return SocketWorker(
            self._link, sock, worker_id, ending, model_endpoint=endpoint, rlimits=rlimits
        )

    def _accept(self) -> SupervisorLink:
        """Listen at ``path`` for the supervisor's one connection, then stop listening.

        The grader container may still be starting: up to ``connect_timeout`` seconds."""
        path = Path(self.path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.path)
            os.chmod(self.path, SOCKET_MODE)
            server.listen(1)
            server.settimeout(self.connect_timeout)
            try:
                sock, _ = server.accept()
            except TimeoutError:
                raise SandboxUnavailable(
                    f"the grader container did not connect to {self.path} within "
                    f"{self.connect_timeout:g} s"
                ) from None
        finally:
            server.close()
            with contextlib.suppress(OSError):
                path.unlink()
        try:
            sock.settimeout(SUPERVISOR_ANSWER_SECONDS)  # for its hello
            link = SupervisorLink(sock)
        except (OSError, ValueError) as exc:
            sock.close()
            raise SandboxUnavailable(f"the grader container's supervisor failed: {exc}") from None
        sock.settimeout(None)
        return link

    def close(self) -> None:
        """Close the control connection: the supervisor ends everything and exits."""
        if self._link is not None:
            self._link.close()
            self._link = None

    def describe(self) -> str:
        return "pod (gVisor grader container)"
