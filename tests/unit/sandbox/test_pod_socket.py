"""``PodSocketBackend``'s one connection: it listens for the grader container's supervisor, which
may start late, for no more than ``connect_timeout``; accepts one connection and stops listening;
and refuses a peer that does not greet it as the supervisor does. Workers over that connection,
against the real supervisor: ``tests/integration/sandbox/test_pod_supervisor.py``."""

from __future__ import annotations

import json
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from evalkube.sandbox.backends import SandboxBackend, SandboxUnavailable

if TYPE_CHECKING:
    from evalkube.sandbox.remote import PodSocketBackend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> type[PodSocketBackend]:
    """The class, imported here rather than at collection: defining it registers ``pod`` among
    the sandbox backends, which other tests list (the CLI imports it only with ``--worker``)."""
    monkeypatch.setattr(SandboxBackend, "registry", dict(SandboxBackend.registry))
    from evalkube.sandbox.remote import PodSocketBackend

    return PodSocketBackend


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A unix socket path short enough for ``sun_path`` (pytest's tmp_path may not be)."""
    with tempfile.TemporaryDirectory(prefix="evk-") as directory:
        yield Path(directory) / "worker.sock"


def _connect_late(path: Path, greeting: bytes, seen: dict[str, object]) -> socket.socket:
    """What the supervisor does: wait for the runner's socket, connect, greet."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)  # gone once the runner accepted
            sock.connect(str(path))
        except OSError:
            sock.close()
            time.sleep(0.05)
            continue
        seen["mode"] = mode
        sock.sendall(greeting)
        return sock
    raise AssertionError("the runner never listened")


def test_it_waits_for_the_supervisor_accepts_it_and_stops_listening(
    backend: type[PodSocketBackend], socket_path: Path
) -> None:
    seen: dict[str, object] = {}
    peers: list[socket.socket] = []

    def supervisor() -> None:
        time.sleep(0.5)
        hello = json.dumps({"t": "hello", "v": 1, "pid": 1}).encode() + b"\n"
        peers.append(_connect_late(socket_path, hello, seen))

    thread = threading.Thread(target=supervisor, daemon=True)
    thread.start()
    pod = backend(str(socket_path), connect_timeout=10)
    link = pod._accept()
    try:
        thread.join(5)
        assert link.pid == 1
        assert seen["mode"] == 0o660  # the grader's group may connect, nobody else
        # one connection, ever: the path is gone and nobody else gets through
        assert not socket_path.exists()
        with socket.socket(socket.AF_UNIX) as other, pytest.raises(FileNotFoundError):
            other.connect(str(socket_path))
    finally:
        link.close()
        for peer in peers:
            peer.close()


def test_a_peer_that_does_not_greet_as_the_supervisor_is_refused(
    backend: type[PodSocketBackend], socket_path: Path
) -> None:
    peers: list[socket.socket] = []
    thread = threading.Thread(
        target=lambda: peers.append(_connect_late(socket_path, b'{"t": "answer"}\n', {})),
        daemon=True,
    )
    thread.start()
    with pytest.raises(SandboxUnavailable, match="supervisor said"):
        backend(str(socket_path), connect_timeout=10).spawn()
    thread.join(5)
    for peer in peers:
        peer.close()


def test_it_gives_up_after_connect_timeout(
    backend: type[PodSocketBackend], socket_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable) as failed:
        backend(str(socket_path), connect_timeout=0.5).spawn()
    waited = time.monotonic() - started
    assert 0.5 <= waited < 5
    assert str(failed.value) == (
        f"the grader container did not connect to {socket_path} within 0.5 s"
    )
