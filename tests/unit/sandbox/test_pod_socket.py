"""``PodSocketBackend.spawn`` waits for a grader container that is still starting, and no more
than ``connect_timeout``."""

from __future__ import annotations

import socket
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
        yield Path(directory) / "grader.sock"


def test_spawn_waits_for_a_socket_that_appears_later(
    backend: type[PodSocketBackend], socket_path: Path
) -> None:
    accepted: list[socket.socket] = []
    listening = threading.Event()

    def serve_late() -> None:
        time.sleep(0.5)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(socket_path))
        server.listen(1)
        listening.set()
        connection, _ = server.accept()
        accepted.append(connection)
        server.close()

    thread = threading.Thread(target=serve_late, daemon=True)
    thread.start()
    worker = backend(str(socket_path), connect_timeout=10).spawn()
    try:
        # spawn kept trying until the socket existed (its first attempt found no file)
        assert listening.is_set()
        thread.join(5)
        assert len(accepted) == 1
    finally:
        worker.close()
        for connection in accepted:
            connection.close()


def test_spawn_gives_up_after_connect_timeout(
    backend: type[PodSocketBackend], socket_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable) as failed:
        backend(str(socket_path), connect_timeout=0.5).spawn()
    waited = time.monotonic() - started
    assert 0.5 <= waited < 5
    assert str(failed.value) == (
        f"grader container socket {socket_path} is not answering: "
        "[Errno 2] No such file or directory"
    )
