"""What the interrupt tests share: a fake provider that answers slowly, and stopping an
``evalkube run`` subprocess once it has made a given number of model calls."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.integration.proxy.fake_upstream import FakeUpstream


class SlowUpstream(FakeUpstream):
    """The fake provider, answering each Responses call after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def _responses(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        return await super()._responses(request)


def write_inputs(directory: Path, rows: Iterable[dict[str, Any]], grader: str) -> None:
    """The suite's dataset, ``rows.jsonl`` (a JSON object a line), and its ``grader.py``."""
    with (directory / "rows.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    (directory / "grader.py").write_text(grader)


def stop_after_calls(
    process: subprocess.Popen[str],
    upstream: FakeUpstream,
    calls: int,
    stop: Callable[[subprocess.Popen[str]], None],
    *,
    what: str,
    timeout: float = 30,
) -> str:
    """Once ``upstream`` has had ``calls`` calls (within 60 s, ``process`` still running, or the
    test fails naming ``what``), ``stop(process)`` and wait ``timeout`` seconds at most for it
    to end; its stderr. The process is killed if it still runs, whatever happened."""
    try:
        deadline = time.monotonic() + 60
        while len(upstream.received) < calls:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"the {what} made no model call"
            time.sleep(0.02)
        stop(process)
        _, stderr = process.communicate(timeout=timeout)
        return stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
