"""gVisor's availability probe starts a real container once per machine, runsc and kernel,
not once per run; what it keeps is never trusted beyond what the probe itself would try, and
a worker that fails to start makes the next start probe again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkube.sandbox import GraderSandbox, Program, SandboxError, backends, gvisor, probe_cache
from evalkube.sandbox.backends import ProcessBackend
from evalkube.sandbox.runsc import PLATFORMS, runsc_path
from tests.integration.sandbox.support import backend

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A machine whose probe never ran (its own cache directory); lists each container the
    probe starts, by platform."""
    backend("gvisor")  # skipped (failed under CI) where gVisor cannot run
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gvisor._probe.cache_clear()
    started: list[str] = []
    real = gvisor._start_worker

    def counted(platform: str) -> str | None:
        started.append(platform)
        return real(platform)

    monkeypatch.setattr(gvisor, "_start_worker", counted)
    yield started
    gvisor._probe.cache_clear()


def _next_run() -> None:
    """What a new ``evalkube run`` process starts from: no answer in memory."""
    gvisor._probe.cache_clear()


def test_the_probe_starts_a_container_once_not_once_per_run(probes: list[str]) -> None:
    found = gvisor.platform()
    assert probes == [found] or probes == list(PLATFORMS[: PLATFORMS.index(found) + 1])
    assert json.loads(probe_cache.cache_file().read_text())["platform"] == found
    started = len(probes)
    for _ in range(3):
        _next_run()
        assert gvisor.platform() == found
    assert len(probes) == started  # the later runs started no probe container


def test_a_kept_platform_the_probe_would_not_try_is_ignored(probes: list[str]) -> None:
    found = gvisor.platform()
    kept = json.loads(probe_cache.cache_file().read_text())
    for forged in ("kvm", "none", 7, ["systrap"]):
        probe_cache.cache_file().write_text(json.dumps({**kept, "platform": forged}))
        _next_run()
        probes.clear()
        assert gvisor.platform() == found
        assert probes, f"a kept platform of {forged!r} was trusted"
    probe_cache.cache_file().write_text("{not json")
    _next_run()
    probes.clear()
    assert gvisor.platform() == found
    assert probes


def test_another_runsc_binary_is_probed_again(
    probes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gvisor.platform()
    installed = runsc_path()
    assert installed is not None
    copy = tmp_path / "bin" / "runsc"
    copy.parent.mkdir()
    shutil.copy2(installed, copy)  # same bytes and mtime, another file
    monkeypatch.setenv("EVALKUBE_RUNSC", str(copy))
    _next_run()
    probes.clear()
    gvisor.platform()
    assert probes


def test_a_worker_that_fails_to_start_makes_the_next_start_probe_again(
    probes: list[str],
) -> None:
    gvisor.platform()
    assert probe_cache.cache_file().exists()
    gvisor.GVisorBackend().worker_did_not_start()
    assert not probe_cache.cache_file().exists()
    probes.clear()
    gvisor.platform()  # this process's answer was dropped too
    assert probes


class _DiesAtStart(ProcessBackend):
    """A backend whose workers exit before their first frame; counts what it is told."""

    told = 0

    def worker_did_not_start(self) -> None:
        type(self).told += 1


def test_the_session_tells_the_backend_when_a_worker_dies_before_its_first_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backends, "WORKER_BOOTSTRAP", "raise SystemExit(3)")
    program = Program("grader", "def grade(sample, item):\n    return 1.0\n", "grader.py", "grade")
    sandbox = GraderSandbox(_DiesAtStart(), [program], task_id="t")
    with pytest.raises(SandboxError, match="worker did not start"):
        sandbox.start()
    assert _DiesAtStart.told >= 1
