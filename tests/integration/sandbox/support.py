"""Helpers shared by the sandbox integration and security tests.

``backend(name)`` hands a test a real backend or skips it with the backend's own reason —
except under CI (``CI`` set), where a backend that cannot run is a failure: CI installs every
backend (``.ci/sandboxes.sh``), so a skip there would hide a broken sandbox.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evalkube.sandbox import (
    AUTO_ORDER,
    Execution,
    GraderSandbox,
    Program,
    SandboxBackend,
    SandboxLimits,
    cgroups,
    resolve_backend,
)
from evalkube.sandbox.backends import RESOURCE_PREFIX

BACKENDS = (*AUTO_ORDER, "process")
ISOLATING = AUTO_ORDER


def backend(name: str) -> SandboxBackend:
    """The backend ``name``; skipped with the reason when unavailable, failed under CI."""
    cls = SandboxBackend.registry[name]
    reason = cls.unavailable_reason()
    if reason is not None:
        message = f"sandbox backend {name!r} is unavailable here: {reason}"
        if os.environ.get("CI"):
            pytest.fail(f"required under CI: {message}")
        pytest.skip(message)
    return resolve_backend(name)


def cgroups_missing(name: str) -> str | None:
    """Why ``name`` has no memory/pids cgroups here (nsjail and bwrap make them as root only).

    Fails the test under CI, where every limit must be in force.
    """
    if name not in ("nsjail", "bwrap"):
        return None
    reason = cgroups.available()
    if reason is None:
        return None
    message = f"{name} has no memory/pids cgroups here: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"required under CI: {message}")
    return message


def require_cgroups(name: str) -> None:
    """Skip (fail under CI) a test of a limit that only a cgroup enforces."""
    message = cgroups_missing(name)
    if message is not None:
        pytest.skip(message)


def grader(source: str, entrypoint: str = "grade") -> list[Program]:
    return [Program("grader", source, "grader.py", entrypoint)]


def run(
    backend_: SandboxBackend,
    source: str,
    samples: Sequence[Any],
    *,
    timeout: float = 2.0,
    model_endpoint: str | None = None,
    limits: SandboxLimits | None = None,
    batch_size: int | None = None,
) -> tuple[list[Execution], int]:
    """Grade ``grade(sample, item)`` over ``samples`` (item = the sample's position)."""
    kwargs: dict[str, Any] = {}
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    sandbox = GraderSandbox(
        backend_,
        grader(source),
        task_id="task",
        model_endpoint=model_endpoint,
        load_timeout=10,
        sandbox_limits=limits,
        **kwargs,
    )
    sandbox.start()
    try:
        items: Iterable[tuple[list[Any], str | None]] = (
            ([sample, index], f"exec-{index}") for index, sample in enumerate(samples)
        )
        executions = list(sandbox.execute("grader", items, timeout=timeout))
    finally:
        sandbox.close()
    return executions, sandbox.restarts


@dataclass(frozen=True)
class Leftovers:
    """Host resources named ``evalkube-*`` that belong to one evalkube process."""

    temp_dirs: list[str]
    cgroups: list[str]

    @property
    def empty(self) -> bool:
        return not self.temp_dirs and not self.cgroups


def leftovers(pid: int | None = None) -> Leftovers:
    """Temp dirs and cgroups of evalkube process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    marker = f"-{pid}-"
    temp = [
        name
        for name in os.listdir(tempfile.gettempdir())
        if name.startswith(RESOURCE_PREFIX)
        and marker in name
        and not name.startswith(f"{RESOURCE_PREFIX}pkg-")
    ]
    groups: list[str] = []
    for base in Path("/sys/fs/cgroup").iterdir():  # runsc makes one in every controller
        if base.is_dir() and not base.is_symlink():
            controller = base.name
            groups += [
                f"{controller}/{name}"
                for name in os.listdir(base)
                if name.startswith(RESOURCE_PREFIX) and marker in name
            ]
    return Leftovers(temp, groups)


def descendants(pid: int) -> set[tuple[int, str]]:
    """``(pid, start time)`` of every live descendant of ``pid`` (start time tells reuse)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    found: set[tuple[int, str]] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add((child, starts[child]))
            stack.append(child)
    return found


def alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """The members of ``processes`` still running (same pid, same start time, not zombie)."""
    left: set[tuple[int, str]] = set()
    for pid, start in processes:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[19] == start and fields[0] != "Z":
            left.add((pid, start))
    return left
