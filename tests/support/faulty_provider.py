"""The real-node tier's fake provider (tests/realnode/fake_provider.py) run on loopback, for
the proxy and engine tests of provider faults: the same server, switched between
misbehaviours over HTTP, whose record of received requests is the bill."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.ports import accepts, free_port

SCRIPT = Path(__file__).resolve().parents[1] / "realnode" / "fake_provider.py"


class FakeProvider:
    """A client of a running fake provider at ``base`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def mode(self, mode: str, **options: Any) -> None:
        """Misbehave as ``mode`` says from now on, and forget what was received."""
        body = json.dumps({"mode": mode, "clear_calls": True, **options}).encode()
        request = urllib.request.Request(f"{self.base}/_mode", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200

    def calls(self) -> list[dict[str, str]]:
        """Every model request received since the last :meth:`mode`."""
        with urllib.request.urlopen(f"{self.base}/_calls", timeout=10) as reply:
            calls: list[dict[str, str]] = json.loads(reply.read())
            return calls


@contextlib.contextmanager
def running_fake_provider() -> Iterator[FakeProvider]:
    """The fake provider in a process of its own on a free loopback port, killed at the end."""
    port = free_port()  # outside the ephemeral range: the poll below cannot reach itself
    server = subprocess.Popen([sys.executable, str(SCRIPT), "127.0.0.1", str(port)])
    try:
        deadline = time.monotonic() + 20
        while not accepts(port):
            if time.monotonic() > deadline:
                raise RuntimeError("the fake provider did not listen within 20 s")
            time.sleep(0.05)
        yield FakeProvider(port)
    finally:
        server.kill()
        server.wait(timeout=10)
