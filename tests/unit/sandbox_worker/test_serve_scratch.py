"""The pod supervisor (:mod:`evalkube_sandbox.serve`) empties the grader's scratch directory
before every worker starts: in a pod a new worker keeps the pod's ``/tmp``, so what a killed,
crashed or defeated worker left there would reach every later sample of the unit. A scratch
directory that cannot be emptied means no worker starts, and the runner hears why.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from evalkube_sandbox import serve
from evalkube_sandbox.serve import SCRATCH_UNCLEAN_CODE, Supervisor

#: What a sample left: the wipe's own staging names taken first, and a killed sample's files.
LEFTOVERS = [
    ".evalkube-wipe-1/Z/big",
    *[f".evalkube-wipe-{n}/Z/small" for n in range(6)],
    "half-written/output.bin",
]


class _Forked(Exception):
    pass


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    directory = tmp_path / "scratch"
    directory.mkdir()
    for relative in LEFTOVERS:
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 65536)
    return directory


@pytest.fixture
def supervisor(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Supervisor, socket.socket]]:
    # this test process is no container: ending "every process" would end pytest's children
    monkeypatch.setattr(serve, "end_everything", lambda me: {})
    runner, control = socket.socketpair()
    supervisor = Supervisor(control, memory_bytes=0, processes=0, log_bytes=0, scratch=str(scratch))
    try:
        yield supervisor, runner
    finally:
        runner.close()
        control.close()


def _at_fork(sup: Supervisor, monkeypatch: pytest.MonkeyPatch, look: Callable[[], Any]) -> Any:
    """What ``look()`` finds at the moment the supervisor forks the next worker (the fork
    itself is stopped there)."""
    seen: list[Any] = []

    def fork() -> int:
        seen.append(look())
        raise _Forked

    monkeypatch.setattr(os, "fork", fork)
    mine, theirs = socket.socketpair()
    sup._fds.append(theirs.detach())
    try:
        with pytest.raises(_Forked):
            sup._spawn(1)
    finally:
        mine.close()
    assert len(seen) == 1
    return seen[0]


def _messages(runner: socket.socket) -> list[dict[str, Any]]:
    runner.settimeout(5)
    data = b""
    while data.count(b"\n") < 2:
        chunk = runner.recv(65536)
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_the_next_worker_starts_on_an_empty_scratch_directory(
    supervisor: tuple[Supervisor, socket.socket], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup, _runner = supervisor
    assert _at_fork(sup, monkeypatch, lambda: os.listdir(scratch)) == []


def test_a_scratch_directory_that_cannot_be_emptied_refuses_the_worker(
    supervisor: tuple[Supervisor, socket.socket], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Space still held (here: a deleted file this process keeps open, as a leftover process
    could): no worker is forked; the runner is told it ended, with the reason."""
    sup, runner = supervisor
    held = (scratch / "held").open("wb")
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("a worker was started"))
    mine, theirs = socket.socketpair()
    sup._fds.append(theirs.detach())
    try:
        sup._spawn(3)
        started, ended = _messages(runner)
        mine.settimeout(5)
        assert mine.recv(1) == b""  # the worker's channel is closed: the runner sees EOF
    finally:
        mine.close()
        held.close()
    assert started == {"t": "started", "id": 3}
    assert ended["t"] == "ended"
    assert ended["id"] == 3
    assert ended["code"] == SCRATCH_UNCLEAN_CODE
    assert "could not be emptied" in ended["reason"]
    assert str(scratch) in ended["reason"]
    assert "still holds" in ended["reason"]
    assert sup.worker is None
    assert os.listdir(scratch) == []  # the rest was wiped all the same


def test_without_a_scratch_directory_nothing_is_wiped(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, control = socket.socketpair()
    try:
        sup = Supervisor(control, memory_bytes=0, processes=0, log_bytes=0)
        assert sup._clear_scratch() is None
    finally:
        runner.close()
        control.close()
    assert sorted(os.listdir(scratch)) == sorted({p.split("/")[0] for p in LEFTOVERS})


def test_the_next_worker_finds_the_scratch_directory_writable_again(
    supervisor: tuple[Supervisor, socket.socket], scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grader that owns the pod's ``/tmp`` made it read-only: the next worker would find it
    unwritable for the rest of the unit; the supervisor gives it its mode back first."""
    sup, _runner = supervisor
    before = scratch.stat().st_mode & 0o7777
    scratch.chmod(0o500)
    try:
        assert _at_fork(sup, monkeypatch, lambda: scratch.stat().st_mode & 0o7777) == before
    finally:
        scratch.chmod(before)
