"""Ingest bodies are parsed and validated off the event loop the operator shares with kopf:
a 16 MB ``POST .../samples`` (and a large ``samples:update``) must not run JSON
parsing or sample validation on the loop's thread.

No timing: a profile hook, set for every thread the test starts (the server's loop thread
and the executor threads it starts later), records on which thread the JSON parser and the
sample decoder ran. The server is the real ingest application on a loopback port, the store
a real SQLite file.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.store import ResultStore, RunRecord, SampleRecord
from evalkube.store.remote import sample_from_wire, sample_to_wire
from evalkube.util import jsonfast

NS, RUN, RUN_ID, TOKEN = "team-a", "nightly", "team-a.nightly.0f1e2d3c", "the-ingest-token"
BASE = f"/api/v1/namespaces/{NS}/evalruns/{RUN}"


class Probe:
    """Counts, per thread, calls of the sample decoder and of the JSON parsers."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[int, str]] = Counter()
        self.decoders: set[str] = set()
        """Names of the threads the sample decoder ran on."""
        self._decoder = sample_from_wire.__code__

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is self._decoder:
            self.calls[(threading.get_ident(), "sample_from_wire")] += 1
            self.decoders.add(threading.current_thread().name)
        elif event == "c_call" and (
            arg is orjson.loads or getattr(arg, "__name__", "") == "validate_json"
        ):
            self.calls[(threading.get_ident(), arg.__name__)] += 1

    def on(self, thread: int) -> dict[str, int]:
        return {name: n for (ident, name), n in self.calls.items() if ident == thread}

    def off(self, thread: int) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (ident, name), n in self.calls.items():
            if ident != thread:
                out[name] += n
        return dict(out)


@contextmanager
def served(store: ResultStore, probe: Probe) -> Iterator[tuple[str, int]]:
    """The ingest application on a loopback port, in a loop thread of its own that (like every
    thread started from now on) carries ``probe``; yields the URL and the loop's thread id."""
    registry = RunRegistry()
    registry.register(RunEntry(NS, RUN, RUN_ID, "qa", digest(TOKEN)))
    api = ApiServer(store, registry, OperatorMetrics())
    threading.setprofile(probe)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(api.ingest_app, access_log=None)
    address: list[Any] = []
    loop_thread: list[int] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        address.append(runner.addresses[0])
        loop_thread.append(threading.get_ident())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        yield f"http://127.0.0.1:{address[0][1]}", loop_thread[0]
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        sys.setprofile(None)


def big_samples(count: int, text_bytes: int) -> list[dict[str, Any]]:
    return [
        sample_to_wire(
            SampleRecord(
                RUN_ID,
                f"s_{i:06d}",
                "qa",
                "m",
                i,
                "valid",
                output_text="x" * text_bytes,
                scores={"score": 1.0},
            )
        )
        for i in range(count)
    ]


def test_a_16_mb_ingest_body_is_parsed_and_validated_off_the_event_loop(tmp_path: Path) -> None:
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
    probe = Probe()
    samples = big_samples(2_000, 8_000)
    body = jsonfast.dumps({"samples": samples})
    assert len(body) > 16_000_000
    updates = jsonfast.dumps(
        {"updates": [{"sample_id": s["sample_id"], "judge": {"x": "y" * 2_000}} for s in samples]}
    )
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    try:
        with served(store, probe) as (url, loop_thread), httpx.Client(base_url=url) as client:
            answer = client.post(f"{BASE}/samples", content=body, headers=auth, timeout=120)
            assert answer.json() == {"recorded": 2_000}
            answer = client.post(f"{BASE}/samples:update", content=updates, headers=auth)
            assert answer.json() == {"updated": 2_000}
            bad = client.post(f"{BASE}/samples", content=b'{"samples": [{}]}', headers=auth)
            assert bad.status_code == 400  # still a 400 naming the problem
            assert "invalid sample" in bad.json()["error"]["message"]
        # the probe worked: the decoder ran for every sample, the parsers ran
        off = probe.off(loop_thread)
        assert off.get("sample_from_wire") == 2_001, off
        assert off.get("loads", 0) >= 2, off
        assert off.get("validate_json", 0) >= 1, off
        # and none of it on the loop's thread: samples on the ingest threads (at most
        # limits.INGEST_THREADS of them, which bounds the operator's memory)
        assert probe.on(loop_thread) == {}, probe.on(loop_thread)
        assert probe.decoders, probe.decoders
        assert all(name.startswith("evalkube-ingest") for name in probe.decoders), probe.decoders
        assert sum(1 for _ in store.iter_samples(RUN_ID)) == 2_000
    finally:
        store.close()


def test_the_ingest_body_limit_still_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body past ``limits.INGEST_BODY_BYTES`` is refused (413) before anything is parsed.

    The server takes its limit from ``limits`` when it is built: here 4 MiB, so the test sends
    4 MiB rather than the 256 MiB of the real limit (20 s on a loaded 2-core machine)."""
    from evalkube import limits

    monkeypatch.setattr(limits, "INGEST_BODY_BYTES", 4 * 1024 * 1024)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    probe = Probe()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = b'{"samples": [' + b" " * (limits.INGEST_BODY_BYTES + 1) + b"]}"
    try:
        with served(store, probe) as (url, _), httpx.Client(base_url=url) as client:
            answer = client.post(f"{BASE}/samples", content=body, headers=auth, timeout=120)
            assert answer.status_code == 413
        assert probe.off(-1).get("sample_from_wire") is None
    finally:
        store.close()
