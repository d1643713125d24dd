"""Fixtures of the proxy tests: the fake provider, key files, and bridges in front of it.

``make_bridge`` runs every test twice: against the Python proxy (:class:`ModelBridge`, in a
thread) and against the native one (:class:`NativeBridge`, the ``evalkube-proxy`` binary that
``.ci/proxy.sh`` builds and ``.ci/test.sh`` exports as ``EVALKUBE_PROXY_BIN``): one contract,
two implementations.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from evalkube.proxy.bridge import ModelBridge
from evalkube.proxy.native import NativeBridge, native_binary
from evalkube.proxy.upstream import Provider
from tests.integration.proxy.fake_upstream import FakeUpstream

KEY = "sk-evalkube-test-0123456789abcdef"

MakeBridge = Callable[..., ModelBridge | NativeBridge]
#: The execution token every bridge of ``make_bridge`` has open when the test starts (tests
#: that configure a unit open their own: configuring closes every token).
OPEN_TOKEN = "exec-1"
ENGINES = ("python", "native")


def native_or_skip() -> str:
    """The native proxy binary; without it the native half fails in CI and skips elsewhere."""
    binary = native_binary()
    if binary is None:
        message = "evalkube-proxy not built: run `bash .ci/proxy.sh` and set EVALKUBE_PROXY_BIN"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Which proxy implementation serves the test."""
    if request.param == "native":
        native_or_skip()
    return str(request.param)


@pytest.fixture
def proxy_log(tmp_path: Path) -> Path:
    """Where a native proxy's stderr goes (the Python proxy logs through ``caplog``)."""
    return tmp_path / "native-proxy.log"


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
def make_bridge(
    upstream: FakeUpstream, key_file: Path, engine: str, proxy_log: Path
) -> Iterator[MakeBridge]:
    """Start bridges against the fake provider (``fake:``), with :data:`OPEN_TOKEN` open; all
    stopped after the test."""
    started: list[ModelBridge | NativeBridge] = []

    def make(
        *,
        timeout: float = 10.0,
        base_url: str | None = None,
        retries: int = 2,
        socket_path: str | None = None,
        api: str = "responses",
        **options: Any,
    ) -> ModelBridge | NativeBridge:
        provider = Provider(
            "fake",
            base_url or upstream.base_url,
            api_key_file=str(key_file),
            headers={"X-Org": "evalkube-tests"},
            timeout=timeout,
            api=api,
        )
        options.setdefault("judge_model", "fake:judge-1")
        options.setdefault("embedding_model", "fake:embed-1")
        bridge: ModelBridge | NativeBridge
        if engine == "native":
            bridge = NativeBridge(
                {"fake": provider},
                retries=retries,
                backoff_base=0.01,
                stderr_path=proxy_log,
                **options,
            )
        else:
            options.setdefault("registry", CollectorRegistry())
            bridge = ModelBridge({"fake": provider}, retries=retries, backoff_base=0.01, **options)
        bridge.start(socket_path)
        started.append(bridge)
        bridge.open_executions([OPEN_TOKEN])
        return bridge

    yield make
    for bridge in started:
        bridge.stop()
