"""The OCI runtime spec (``config.json``) of a gVisor grader sandbox, built by a pure function.

The container: an empty read-only root (the bundle's ``rootfs`` directory, holding only mount
points and the host's ``/bin``-style symlinks), read-only binds of the system, the worker
package (:mod:`evalkube.sandbox.hostfs`) and the grader environment, a size-capped tmpfs
``/tmp``, uid/gid 65534, no capabilities, ``noNewPrivileges``, fresh namespaces, memory and
pids limits, and the model bridge's socket when model access is on. No network is set up
(runsc runs with ``--network=none``).
"""

from __future__ import annotations

from typing import Any

from evalkube.sandbox.environment import INSIDE_ENVIRONMENT
from evalkube.sandbox.hostfs import (
    INSIDE_BRIDGE_SOCKET,
    INSIDE_WORKER_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    SystemEntry,
)

_RO_BIND = ["rbind", "ro", "nosuid", "nodev"]


def build_spec(
    *,
    args: list[str],
    env: dict[str, str],
    system: list[SystemEntry],
    worker_package: str,
    bridge_socket: str | None,
    memory_bytes: int,
    environment: str | None = None,
    pids: int,
    tmp_bytes: int,
    open_files: int,
    cgroups_path: str,
    hostname: str = "evalkube-sandbox",
) -> dict[str, Any]:
    """The whole ``config.json``; symlink entries of ``system`` go into the rootfs instead."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={max(1, tmp_bytes // 1024)}k"],
        },
    ]
    binds = [(entry.path, entry.path) for entry in system if entry.target is None]
    binds.append((worker_package, f"{INSIDE_WORKER_ROOT}/evalkube_sandbox"))
    if environment is not None:
        binds.append((environment, INSIDE_ENVIRONMENT))
    if bridge_socket is not None:
        binds.append((bridge_socket, INSIDE_BRIDGE_SOCKET))
    mounts += [
        {"destination": inside, "type": "bind", "source": source, "options": _RO_BIND}
        for source, inside in binds
    ]
    no_caps: list[str] = []
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": SANDBOX_UID, "gid": SANDBOX_GID, "additionalGids": []},
            "args": args,
            "env": [f"{key}={value}" for key, value in sorted(env.items())],
            "cwd": "/tmp",
            "capabilities": {
                "bounding": no_caps,
                "effective": no_caps,
                "inheritable": no_caps,
                "permitted": no_caps,
                "ambient": no_caps,
            },
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": open_files, "soft": open_files},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "resources": {
                "memory": {"limit": memory_bytes, "swap": memory_bytes},
                "pids": {"limit": pids},
            },
            "cgroupsPath": cgroups_path,
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
        },
    }


def rootfs_dirs(system: list[SystemEntry], *, bridge: bool, environment: bool = False) -> list[str]:
    """Directory mount points to create in the empty rootfs (relative paths).

    With ``bridge``, the socket's mount point (a file) goes in the last one listed.
    """
    dirs = ["proc", "dev", "tmp", "sys", f"{INSIDE_WORKER_ROOT.lstrip('/')}/evalkube_sandbox"]
    dirs += [entry.path.lstrip("/") for entry in system if entry.target is None]
    if environment:
        dirs.append(INSIDE_ENVIRONMENT.lstrip("/"))
    if bridge:
        dirs.append(INSIDE_BRIDGE_SOCKET.lstrip("/").rsplit("/", 1)[0])
    return dirs
