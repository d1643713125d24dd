"""``evalkube report --api`` and API exports at size: the report of an EvalRun read
from the operator's samples API is the report of the same run read from the store, and
exports page through samples whose judges hold 200 kB each within bounded memory (on the
operator, one page is at most ``limits.SAMPLES_PAGE_BYTES``; on the client, the export's own
peak RSS stays flat). Real subprocesses, the operator's real API application on loopback,
real SQLite stores.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from evalkube import limits
from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.store import ResultStore, RunRecord, SampleRecord

from .report_data import RUN, make_report_store

pytestmark = pytest.mark.timeout(300)

EVALKUBE = Path(sys.executable).parent / "evalkube"
TOKEN = "read-token"
#: Runs the ``evalkube`` command in this process and prints its peak RSS at exit (the
#: kernel's VmHWM of this process: ``ru_maxrss`` would include the parent's).
WRAPPER = (
    "import atexit, re, sys\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    kib = re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)\n"
    "    print('PEAK_RSS', int(kib) * 1024, file=sys.stderr)\n"
    "atexit.register(peak)\n"
    "from evalkube.cli import main\n"
    "sys.argv = ['evalkube', *sys.argv[1:]]\n"
    "main()\n"
)


@contextmanager
def api_of(store: ResultStore, run_id: str) -> Iterator[str]:
    """The operator's API application over ``store`` on a loopback port, serving ``run_id`` as
    the EvalRun team/nightly."""
    registry = RunRegistry()
    registry.register(RunEntry("team", "nightly", run_id, "suite", digest("ingest")))
    server = ApiServer(store, registry, OperatorMetrics(), read_token=TOKEN)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.api_app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def run(*args: str, cwd: Path, wrapped: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", WRAPPER, *args] if wrapped else [str(EVALKUBE), *args]
    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=250,
        env={**os.environ, "EVALKUBE_API_TOKEN": TOKEN},
    )


def _comparable(html: str) -> str:
    """The page without the moment it was made."""
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "<time>", html)


def test_report_api_is_the_report_of_the_store(tmp_path: Path) -> None:
    url = make_report_store(tmp_path / "operator.db")
    store = ResultStore.open(url)
    try:
        with api_of(store, RUN) as api:
            done = run(
                "report", "nightly", "--api", api, "-n", "team", "-o", "api.html", cwd=tmp_path
            )
            assert done.returncode == 0, done.stderr
            refused = subprocess.run(
                [str(EVALKUBE), "report", "nightly", "--api", api, "-n", "team"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                env={k: v for k, v in os.environ.items() if k != "EVALKUBE_API_TOKEN"},
            )
        local = run("report", RUN, "--db", url, "-o", "local.html", cwd=tmp_path)
        assert local.returncode == 0, local.stderr
    finally:
        store.close()
    from_api = (tmp_path / "api.html").read_text()
    assert _comparable(from_api) == _comparable((tmp_path / "local.html").read_text())
    assert "Capital of France?" in from_api
    assert refused.returncode == 2
    assert "HTTP 401" in refused.stderr


def big_samples(run_id: str, count: int, judge_bytes: int) -> list[SampleRecord]:
    return [
        SampleRecord(
            run_id,
            f"s{i:05d}",
            "qa",
            "m",
            i,
            "valid",
            row_id=str(i),
            output_text=f"out {i}",
            scores={"exact": float(i % 2)},
            judge={"why": "j" * judge_bytes},
        )
        for i in range(count)
    ]


def test_api_pages_are_bounded_in_bytes_and_walk_everything_once(tmp_path: Path) -> None:
    """300 samples of 200 kB asked for 1,000 at a time: each answer holds at most
    SAMPLES_PAGE_BYTES of samples (plus one), and the cursor walks every sample once."""
    store = ResultStore.open(f"sqlite:///{tmp_path / 'operator.db'}")
    try:
        store.create_run(RunRecord("big", "suite", "sha256:0", {}, "pod"))
        store.record_samples(big_samples("big", 300, 200_000))
        seen: list[str] = []
        sizes: list[int] = []
        with api_of(store, "big") as api, httpx.Client(base_url=api, timeout=60) as client:
            cursor = None
            while True:
                params = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
                answer = client.get(
                    "/api/v1/namespaces/team/evalruns/nightly/samples",
                    params=params,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
                assert answer.status_code == 200, answer.text
                sizes.append(len(answer.content))
                body = answer.json()
                seen += [s["sample_id"] for s in body["samples"]]
                cursor = body["next_cursor"]
                if not cursor:
                    break
    finally:
        store.close()
    assert seen == [f"s{i:05d}" for i in range(300)]
    assert len(sizes) > 1
    assert max(sizes) <= limits.SAMPLES_PAGE_BYTES + 250_000


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_api_exports_stream_in_bounded_memory(tmp_path: Path, fmt: str) -> None:
    """500 samples of 200 kB (100 MB) exported through the API to a file: every sample is
    written, and the export's peak RSS stays far below what the samples weigh."""
    store = ResultStore.open(f"sqlite:///{tmp_path / 'operator.db'}")
    try:
        store.create_run(RunRecord("big", "suite", "sha256:0", {}, "pod"))
        store.record_samples(big_samples("big", 500, 200_000))
        with api_of(store, "big") as api:
            out = tmp_path / f"export.{fmt}"
            done = run(
                "samples", "nightly", "--api", api, "-n", "team", "-f", fmt, "-o", str(out),
                cwd=tmp_path, wrapped=True,
            )  # fmt: skip
            base = run("samples", "nightly", "--api", api, "-n", "team", "--limit", "1",
                       cwd=tmp_path, wrapped=True)  # fmt: skip
    finally:
        store.close()
    assert done.returncode == 0, done.stderr
    assert f"wrote 500 samples to {out}" in done.stderr
    if fmt == "jsonl":
        lines = out.read_text().splitlines()
        assert [json.loads(line)["sample_id"] for line in lines] == [
            f"s{i:05d}" for i in range(500)
        ]
    peak = int(re.search(r"PEAK_RSS (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    idle = int(re.search(r"PEAK_RSS (\d+)", base.stderr).group(1))  # type: ignore[union-attr]
    print(
        f"{fmt} export of 100 MB: peak RSS {peak / 2**20:.0f} MiB (one sample: {idle / 2**20:.0f})"
    )
    # a page is held a few times over (the answer's bytes, its text, the parsed samples), and
    # the samples of 100 MB never are (reading them all took 121 MiB more than one sample)
    assert peak - idle < 6 * limits.SAMPLES_PAGE_BYTES, (peak, idle)
