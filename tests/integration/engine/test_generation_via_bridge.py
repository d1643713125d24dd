"""Candidate generation in a work-unit pod: through the proxy's control listener.

The runner holds no provider key; the proxy (here a real ModelBridge on unix sockets)
injects it and counts the calls as ``candidate``. The provider is a real loopback server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkube.engine.candidates import GeneratedSource
from evalkube.models import EvalRunSpec, validate_spec
from evalkube.proxy.bridge import ModelBridge
from evalkube.proxy.providers import providers_from_spec
from tests.integration.proxy.fake_upstream import FakeUpstream

KEY = "sk-candidate-0123456789abcdef"


@pytest.mark.timeout(60)
def test_candidates_through_the_bridge_control_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KEY", KEY)
    with FakeUpstream() as upstream:
        spec = validate_spec(
            EvalRunSpec,
            {
                "models": ["openai:gpt-4.1-mini"],
                "providers": {"openai": {"baseURL": upstream.base_url, "apiKeyEnv": "TEST_KEY"}},
                "generation": {"temperature": 0, "concurrency": 4},
            },
        )
        control = tmp_path / "control.sock"
        bridge = ModelBridge(providers_from_spec(spec), control_listen=f"unix:{control}")
        bridge.start(str(tmp_path / "bridge.sock"))
        try:
            source = GeneratedSource("openai:gpt-4.1-mini", spec, bridge_control=f"unix:{control}")
            prompts = ["What is 2+2?", [{"role": "user", "content": "Say hi"}], None]
            candidates = source.candidates([{}, {}, {}], ["a", "b", "c"], prompts)
        finally:
            bridge.stop()
        received = list(upstream.received)
    assert [c.output_text for c in candidates[:2]] == [
        "echo: What is 2+2?",
        "echo: [{'role': 'user', 'content': 'Say hi'}]",
    ]
    assert all(c.response_id and c.model_calls["candidate"] == 1 for c in candidates[:2])
    assert candidates[2].error == "no prompt rendered"
    assert len(received) == 2
    for call in received:
        assert call.headers["Authorization"] == f"Bearer {KEY}"
        assert call.body["model"] == "gpt-4.1-mini"
        assert call.body["temperature"] == 0


@pytest.mark.timeout(30)
def test_an_unreachable_bridge_is_an_error_per_sample(tmp_path: Path) -> None:
    spec = validate_spec(
        EvalRunSpec,
        {"models": ["openai:m"], "providers": {"openai": {"baseURL": "http://127.0.0.1:9/v1"}}},
    )
    source = GeneratedSource("openai:m", spec, bridge_control=f"unix:{tmp_path / 'none.sock'}")
    [candidate] = source.candidates([{}], ["a"], ["hello"])
    assert candidate.error is not None
    assert "model bridge unreachable" in candidate.error
