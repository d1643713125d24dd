"""Sandbox backends: how a grader worker process is started and killed.

Every backend runs the same stdlib-only worker (``evalkube_sandbox``) and hands back a
:class:`WorkerProcess` with three pipes; everything above (batching, deadlines, restarts)
is backend-independent. ``auto`` picks the strongest backend that works on this machine.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, ClassVar

import evalkube_sandbox
from evalkube import limits

#: Where the worker package lives on the host (bound read-only into sandboxes).
WORKER_ROOT = Path(evalkube_sandbox.__file__).resolve().parent.parent
#: The bootstrap the worker is started with: no site-packages, no user environment.
WORKER_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from evalkube_sandbox.worker import main; raise SystemExit(main())"
)


class SandboxUnavailable(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""


class WorkerProcess:
    """A running worker: request/answer/stderr pipes and a kill that leaves nothing behind."""

    def __init__(self, popen: subprocess.Popen[bytes], workdir: Path) -> None:
        self.popen = popen
        self.workdir = workdir

    @property
    def stdin(self) -> IO[bytes]:
        assert self.popen.stdin is not None
        return self.popen.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self.popen.stdout is not None
        return self.popen.stdout

    @property
    def stderr(self) -> IO[bytes]:
        assert self.popen.stderr is not None
        return self.popen.stderr

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        """Kill the worker and everything it started (its whole process group)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self.close()

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        shutil.rmtree(self.workdir, ignore_errors=True)


class SandboxBackend(ABC):
    """A way to start grader workers. Subclasses register themselves by ``name``."""

    name: ClassVar[str]
    #: True when user code is isolated from the host (network, files, processes).
    isolating: ClassVar[bool]
    registry: ClassVar[dict[str, type[SandboxBackend]]] = {}

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        SandboxBackend.registry[cls.name] = cls

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """``None`` when the backend works here, otherwise why it does not."""

    @abstractmethod
    def spawn(self) -> WorkerProcess:
        """Start one worker process."""

    def describe(self) -> str:
        return self.name if self.isolating else f"{self.name} (unsafe: no isolation)"


def _worker_env() -> dict[str, str]:
    """The worker's whole environment: nothing inherited, so no secret can leak in."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _apply_rlimits() -> None:
    """Runs in the child before exec: its own session (for killpg) and resource limits."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (limits.WORKER_MEMORY_BYTES, limits.WORKER_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.WORKER_OPEN_FILES, limits.WORKER_OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class ProcessBackend(SandboxBackend):
    """A plain subprocess with rlimits: fast, but no isolation. For trusted graders only."""

    name = "process"
    isolating = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def spawn(self) -> WorkerProcess:
        workdir = Path(tempfile.mkdtemp(prefix="evalkube-worker-"))
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WORKER_BOOTSTRAP, str(WORKER_ROOT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_worker_env(),
            preexec_fn=_apply_rlimits,  # noqa: PLW1509 - no threads hold locks we need here
            close_fds=True,
        )
        return WorkerProcess(popen, workdir)


#: Strongest first: what ``auto`` tries.
AUTO_ORDER = ("gvisor", "nsjail", "bwrap", "process")


def resolve_backend(name: str) -> SandboxBackend:
    """The backend called ``name``, or for ``auto`` the strongest one available here."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            cls = SandboxBackend.registry.get(candidate)
            if cls is not None and cls.unavailable_reason() is None:
                return cls()
        raise SandboxUnavailable("no sandbox backend is available")
    cls = SandboxBackend.registry.get(name)
    if cls is None:
        known = ", ".join(["auto", *sorted(SandboxBackend.registry)])
        raise SandboxUnavailable(f"unknown sandbox {name!r}; choose one of {known}")
    reason = cls.unavailable_reason()
    if reason is not None:
        raise SandboxUnavailable(f"sandbox {name!r} cannot run here: {reason}")
    return cls()
