"""The spawn path shared by the namespace backends (nsjail, bwrap).

A per-sandbox cgroup when cgroups are writable (:mod:`evalkube.sandbox.cgroups`), joined by
the child before ``exec``; the model bridge's socket to bind; the child's setup
(own session, parent-death signal, optionally dropping to the sandbox user first); and a
:class:`~evalkube.sandbox.backends.WorkerProcess` whose kill empties and removes the cgroup.
"""

from __future__ import annotations

import os
import subprocess
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Protocol

from evalkube.sandbox import cgroups, hostfs
from evalkube.sandbox.backends import (
    ChildSetup,
    SandboxBackend,
    SandboxUnavailable,
    SpawnRequest,
    WorkerProcess,
    cleanup_on_error,
    spawn_pipes,
    worker_env,
)

#: Seconds an availability probe may take.
PROBE_TIMEOUT = 30.0


def spawn_jailed(
    request: SpawnRequest,
    build_argv: Callable[[Path | None], list[str]],
    *,
    drop_to_sandbox_user: bool,
) -> WorkerProcess:
    """Start ``build_argv(bridge_socket)`` in a fresh cgroup; see the module docstring."""
    cgroups.sweep_stale()
    limits = request.limits
    drop = drop_to_sandbox_user and os.geteuid() == 0
    env = request.environment
    if drop and env is not None and not hostfs.sandbox_user_can_reach(env):
        raise SandboxUnavailable(
            f"the grader environment {env} is not reachable by the sandbox user (uid "
            f"{hostfs.SANDBOX_UID}), which mounts it: a directory above it is closed to "
            "others; put it elsewhere (EVALKUBE_GRADER_ENV_CACHE) or make it searchable"
        )
    bridge_socket, inside_endpoint = hostfs.bridge_mount(request.model_endpoint)
    argv = build_argv(bridge_socket)
    group: cgroups.Cgroup | None = None
    if cgroups.available() is None:
        group = cgroups.Cgroup(limits.cgroup_memory_bytes, limits.pids)
    setup = ChildSetup(
        cgroup_procs=group.procs_files if group is not None else (),
        uid=hostfs.SANDBOX_UID if drop else None,
        gid=hostfs.SANDBOX_GID if drop else None,
    )
    with cleanup_on_error([group.destroy] if group is not None else []):
        popen = spawn_pipes(argv, setup)

    def describe_exit(code: int | None) -> str | None:
        if group is not None and group.oom_killed():
            return (
                "the grader sandbox ran out of memory (limit "
                f"{limits.cgroup_memory_bytes // (1024 * 1024)} MiB) and was killed"
            )
        return None

    return WorkerProcess(
        popen,
        None,
        model_endpoint=inside_endpoint,
        rlimits=limits.worker_rlimits(),
        terminate=group.destroy if group is not None else None,
        cleanup=[group.destroy] if group is not None else [],
        describe_exit=describe_exit,
    )


def run_probe(
    argv: list[str], what: str, *, uid: int | None = None, gid: int | None = None
) -> str | None:
    """Run a test command the way workers run; ``None`` when it worked, else why not."""
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT,
            check=False,
            env=worker_env(),
            cwd="/",
            user=uid,
            group=gid,
            extra_groups=[] if gid is not None else None,
        )
    except subprocess.TimeoutExpired:
        return f"{what} did not run a test command within {PROBE_TIMEOUT:g} s"
    except OSError as exc:
        return f"{what} cannot be executed: {exc}"
    if result.returncode != 0:
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        return f"{what} failed to run a test command (exit {result.returncode}): " + " | ".join(
            tail
        )
    return None


class ArgvBuilder(Protocol):
    """Builds a jail's command line (``bwrap_argv``, ``nsjail_argv``: pure functions)."""

    def __call__(
        self,
        tool: str,
        request: SpawnRequest,
        /,
        *,
        worker_package: str,
        bridge_socket: Path | None,
        system: list[hostfs.SystemEntry],
    ) -> list[str]: ...


class JailedBackend(SandboxBackend):
    """What nsjail and bwrap share: namespaces + read-only binds + cgroups, one spawn path.

    Subclasses name the tool, how to find it, what to install when it is missing and how to
    build its argv; the probe runs a test command through that argv.
    """

    isolating = True
    #: Whether the spawn drops to the sandbox user itself (nsjail maps users on its own).
    drop_to_sandbox_user: ClassVar[bool]
    #: The probe's answer when :meth:`locate` finds nothing (what to install, and how).
    not_installed: ClassVar[str]

    @staticmethod
    @abstractmethod
    def locate() -> str | None:
        """Path of the tool, or ``None`` when it is not installed."""

    build_argv: ClassVar[ArgvBuilder]

    @classmethod
    def _argv(cls, tool: str, request: SpawnRequest, bridge_socket: Path | None) -> list[str]:
        return cls.build_argv(
            tool,
            request,
            worker_package=str(hostfs.worker_package_dir()),
            bridge_socket=bridge_socket,
            system=hostfs.system_entries(),
        )

    @classmethod
    def probe_argv(cls, argv: list[str]) -> list[str]:
        """A worker's argv adjusted for the probe (the probe reads the tool's own errors)."""
        return argv

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """``None`` when the tool runs a test command here the way workers run, else why not."""
        tool = cls.locate()
        if tool is None:
            return cls.not_installed
        problem = hostfs.python_problem()
        if problem:
            return problem
        argv = cls.probe_argv(cls._argv(tool, SpawnRequest(), None))
        argv = [*argv[: argv.index("--") + 1], hostfs.INSIDE_PYTHON, "-I", "-S", "-c", "pass"]
        drop = cls.drop_to_sandbox_user and os.geteuid() == 0
        return run_probe(
            argv,
            cls.name,
            uid=hostfs.SANDBOX_UID if drop else None,
            gid=hostfs.SANDBOX_GID if drop else None,
        )

    def describe(self) -> str:
        problem = cgroups.available()
        return self.name if problem is None else f"{self.name} (no memory/pids cgroups: {problem})"

    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        request = request or SpawnRequest()
        tool = self.locate()
        if tool is None:
            raise SandboxUnavailable(f"{self.name} is not installed")
        return spawn_jailed(
            request,
            lambda bridge_socket: self._argv(tool, request, bridge_socket),
            drop_to_sandbox_user=self.drop_to_sandbox_user,
        )
