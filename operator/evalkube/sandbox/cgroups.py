"""Per-sandbox cgroups (v1 ``memory`` and ``pids``) for the nsjail and bwrap backends.

A sandbox gets ``/sys/fs/cgroup/{memory,pids}/evalkube-cg-<pid>-<random>``: the memory limit
covers the worker, its children and its /tmp; the pids limit stops fork bombs. The spawned
child joins them before it drops privileges (:class:`evalkube.sandbox.backends.ChildSetup`),
so everything the sandbox starts is inside. :meth:`Cgroup.destroy` kills whatever is left in
them and removes the directories; :func:`sweep_stale` removes those of dead evalkube processes.

gVisor manages its own cgroups from the OCI spec (``linux.cgroupsPath``) and only uses this
module to remove them and to sweep.

Where cgroup v1 controllers are not writable (not root, or a pure cgroup v2 host),
:func:`available` says why and the backends fall back to rlimits alone, saying so in
``describe()``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from evalkube.sandbox.backends import owner_is_dead, resource_name

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
KIND = "cg"


def available() -> str | None:
    """``None`` when per-sandbox v1 memory and pids cgroups can be made, else why not."""
    for controller in CONTROLLERS:
        base = ROOT / controller
        if not (base / "cgroup.procs").exists():
            return f"no cgroup v1 {controller} controller at {base}"
        if not os.access(base, os.W_OK):
            return f"{base} is not writable (run as root for memory and pids limits)"
    return None


class Cgroup:
    """One sandbox's memory and pids cgroups."""

    def __init__(self, memory_bytes: int, pids: int) -> None:
        name = resource_name(KIND)
        self.paths = {c: ROOT / c / name for c in CONTROLLERS}
        created: list[Path] = []
        try:
            for path in self.paths.values():
                path.mkdir()
                created.append(path)
            memory = self.paths["memory"]
            _write(memory / "memory.limit_in_bytes", memory_bytes)
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", memory_bytes)
            _write(memory / "memory.swappiness", 0, missing_ok=True)
            _write(self.paths["pids"] / "pids.max", pids)
        except BaseException:
            for path in created:
                _rmdir(path)
            raise

    @property
    def procs_files(self) -> tuple[str, ...]:
        return tuple(str(path / "cgroup.procs") for path in self.paths.values())

    def oom_killed(self) -> bool:
        """True when the memory limit was hit (the kernel killed or refused an allocation)."""
        memory = self.paths["memory"]
        try:
            control = (memory / "memory.oom_control").read_text()
        except OSError:
            return False
        for line in control.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        try:  # older kernels have no oom_kill counter: the limit was at least reached
            return int((memory / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def destroy(self) -> None:
        """Kill everything still in the cgroups and remove them (idempotent)."""
        destroy_paths(list(self.paths.values()))


def controller_dirs() -> list[Path]:
    """Every mounted v1 controller directory (``/sys/fs/cgroup/memory``, ``.../cpu``, ...)."""
    try:
        return [p for p in ROOT.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def destroy_paths(paths: list[Path]) -> None:
    """Kill every process in ``paths`` (cgroup dirs) and remove them; retries while busy."""
    deadline = time.monotonic() + 10
    for path in paths:
        while path.exists():
            for pid in _procs(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if _rmdir(path) or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def sweep_stale(kinds: tuple[str, ...] = (KIND,)) -> list[str]:
    """Remove cgroups named after dead evalkube processes; return their names."""
    removed: list[str] = []
    for base in controller_dirs():  # every controller: runsc makes its cgroups in all of them
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if any(owner_is_dead(name, kind) for kind in kinds) and (base / name).is_dir():
                destroy_paths([base / name])
                removed.append(f"{base.name}/{name}")
    return removed


def _procs(path: Path) -> list[int]:
    try:
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _rmdir(path: Path) -> bool:
    """Remove one cgroup dir (and nested ones first); True when it is gone."""
    try:
        for child in path.iterdir():
            if child.is_dir():
                destroy_paths([child])
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise


def _write(path: Path, value: int, *, missing_ok: bool = False) -> None:
    try:
        path.write_text(str(value))
    except OSError:
        if not missing_ok:
            raise
