"""The ``bwrap`` backend: bubblewrap namespaces, a read-only root and cgroups.

bubblewrap runs unprivileged: as root, the child drops to uid/gid 65534 before ``exec``
(after joining the sandbox's cgroup), so bwrap maps 65534 to 65534 and the worker holds no
host privilege even outside its namespaces. Fresh user, mount, pid, network (only ``lo``),
ipc, uts and cgroup namespaces; no nested user namespaces; the read-only root of
:mod:`evalkube.sandbox.hostfs` with a size-capped tmpfs ``/tmp``; the worker dies with bwrap.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evalkube.sandbox import hostfs
from evalkube.sandbox.backends import SpawnRequest, worker_env
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT
from evalkube.sandbox.jailed import JailedBackend


def bwrap_path() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None
    )


def bwrap_argv(
    bwrap: str,
    request: SpawnRequest,
    *,
    worker_package: str,
    bridge_socket: Path | None,
    system: list[hostfs.SystemEntry],
) -> list[str]:
    """The bwrap command line for one worker (pure: unit-tested)."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid", str(hostfs.SANDBOX_UID),
        "--gid", str(hostfs.SANDBOX_GID),
        "--hostname", "evalkube-sandbox",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]  # fmt: skip
    for key, value in sorted(worker_env().items()):
        argv += ["--setenv", key, value]
    for entry in system:
        if entry.target is not None:
            argv += ["--symlink", entry.target, entry.path]
        else:
            argv += ["--ro-bind", entry.path, entry.path]
    argv += [
        "--ro-bind", worker_package, f"{hostfs.INSIDE_WORKER_ROOT}/evalkube_sandbox",
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(request.limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
    ]  # fmt: skip
    if request.environment is not None:
        argv += ["--ro-bind", str(request.environment), INSIDE_ENVIRONMENT]
    if bridge_socket is not None:
        argv += ["--ro-bind", str(bridge_socket), hostfs.INSIDE_BRIDGE_SOCKET]
    argv += [
        "--remount-ro", "/",
        # --dev's tmpfs (and its /dev/shm) would keep what one sample plants for the next
        # (a /dev/stdout symlink, files), past the wipe of /tmp: read-only, as in gVisor
        "--remount-ro", "/dev",
        "--chdir", "/tmp",
        "--", *hostfs.inside_worker_argv(request.environment is not None),
    ]  # fmt: skip
    return argv


class BwrapBackend(JailedBackend):
    """bubblewrap: namespaces + read-only binds + cgroups, unprivileged."""

    name = "bwrap"
    drop_to_sandbox_user = True
    not_installed = "bubblewrap is not installed (apt-get install bubblewrap, or .ci/sandboxes.sh)"
    locate = staticmethod(bwrap_path)
    build_argv = staticmethod(bwrap_argv)
