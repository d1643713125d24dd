"""Fixtures of the proxy tests: the fake provider, key files, and bridges in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from evalkube.proxy.bridge import ModelBridge
from evalkube.proxy.upstream import Provider
from tests.integration.proxy.fake_upstream import FakeUpstream

KEY = "sk-evalkube-test-0123456789abcdef"

MakeBridge = Callable[..., ModelBridge]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "secrets" / "fake"
    path.parent.mkdir()
    path.write_text(KEY + "\n")
    return path


@pytest.fixture
def make_bridge(upstream: FakeUpstream, key_file: Path) -> Iterator[MakeBridge]:
    """Start bridges against the fake provider (``fake:``); all stopped after the test."""
    started: list[ModelBridge] = []

    def make(
        *,
        timeout: float = 10.0,
        base_url: str | None = None,
        retries: int = 2,
        socket_path: str | None = None,
        **options: Any,
    ) -> ModelBridge:
        provider = Provider(
            "fake",
            base_url or upstream.base_url,
            api_key_file=str(key_file),
            headers={"X-Org": "evalkube-tests"},
            timeout=timeout,
        )
        options.setdefault("judge_model", "fake:judge-1")
        options.setdefault("embedding_model", "fake:embed-1")
        options.setdefault("registry", CollectorRegistry())
        bridge = ModelBridge({"fake": provider}, retries=retries, backoff_base=0.01, **options)
        bridge.start(socket_path)
        started.append(bridge)
        return bridge

    yield make
    for bridge in started:
        bridge.stop()
