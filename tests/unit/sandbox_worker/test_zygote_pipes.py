"""The worker reads a sample's answer to its last byte even when the sample's process wrote
it and exited between two polls (under load the poll's timeout and the exit interleave)."""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Any

import pytest

from evalkube_sandbox import zygote


def _exited_after_writing(data: bytes) -> tuple[int, int]:
    """A child that wrote ``data`` and exited (a zombie, not reaped); the pipe's read end."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, data)
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            if stat.read().rpartition(b")")[2].split()[0] == b"Z":
                return pid, read_end
        time.sleep(0.01)
    raise AssertionError("the child did not exit")


def test_an_answer_written_between_a_timed_out_poll_and_the_exit_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = len(b"verdict").to_bytes(zygote.HEADER_BYTES, "little") + b"verdict"
    pid, read_end = _exited_after_writing(answer)
    real = select.select
    polls: list[Any] = []

    def first_poll_times_out(*args: Any) -> Any:
        polls.append(args)
        return ([], [], []) if len(polls) == 1 else real(*args)

    monkeypatch.setattr(select, "select", first_poll_times_out)
    try:
        assert zygote._receive(read_end, pid, payload_bytes=1000) == (b"verdict", None)
    finally:
        os.close(read_end)
        with contextlib.suppress(ChildProcessError):  # reaped by the receive's check
            os.waitpid(pid, 0)
    assert len(polls) > 1
