"""Fixtures of the hostile suite: a loopback listener, secrets, host files to protect."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

# The model bridge fixtures (fake provider, both proxy engines) for the hostile-client tests.
from tests.integration.proxy.conftest import (  # noqa: F401
    engine,
    key_file,
    make_bridge,
    proxy_log,
    upstream,
)

SECRET = "evalkube-test-secret-7f3a9c"


class Listener:
    """A TCP listener on the host's loopback that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def host_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The secret in this (the engine's) environment, in a results DB and a credentials file.

    The files are world-readable in a world-writable directory: file permissions alone would
    let the sandbox user in, so only the sandbox's own view of the filesystem keeps it out.
    """
    monkeypatch.setenv("EVALKUBE_TEST_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    home = Path(tempfile.mkdtemp(prefix="hostile-"))
    home.chmod(0o777)
    database = home / "results.db"
    with sqlite3.connect(database) as db:
        db.execute("create table samples (judge text)")
        db.execute("insert into samples values (?)", (SECRET,))
    credentials = home / "credentials.json"
    credentials.write_text(json.dumps({"api_key": SECRET}))
    for path in (database, credentials):
        path.chmod(0o644)
    try:
        yield {
            "secret": SECRET,
            "database": str(database),
            "credentials": str(credentials),
            "host_file": str(home / "pwned"),
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)
