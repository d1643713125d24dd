"""The early stop on errors and the provider checks before a run (pure, no I/O but env)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkube.engine.guard import ErrorGuard, RunAborted
from evalkube.local.preflight import check_providers, used_providers
from evalkube.models import EvalRunSpec


def test_guard_stops_after_the_minimum_when_everything_failed() -> None:
    guard = ErrorGuard(max_rate=1.0, min_samples=5)
    for _ in range(4):
        guard.count("model calls", "t", "openai:m", "HTTP 404")
    with pytest.raises(RunAborted, match=r"task 't' · openai:m: 5 of the first 5 model calls"):
        guard.count("model calls", "t", "openai:m", "HTTP 404")


def test_guard_at_full_rate_never_stops_once_one_succeeded() -> None:
    guard = ErrorGuard(max_rate=1.0, min_samples=5)
    guard.count("samples", "t", "m", None)
    for _ in range(100):
        guard.count("samples", "t", "m", "ValueError: boom")


def test_guard_counts_each_task_and_model_apart_and_honours_a_lower_rate() -> None:
    guard = ErrorGuard(max_rate=0.5, min_samples=4)
    for _ in range(3):
        guard.count("samples", "a", "m", None)
        guard.count("samples", "b", "m", "boom")
    guard.count("samples", "a", "m", "boom")  # a: 1 of 4
    with pytest.raises(RunAborted, match=r"task 'b' · m: 4 of the first 4 samples"):
        guard.count("samples", "b", "m", "boom")


def spec(**provider: object) -> EvalRunSpec:
    return EvalRunSpec.model_validate(
        {
            "models": ["openai:gpt-x", "precomputed"],
            "judgeModel": "judge:j-1",
            "providers": {
                "openai": {"baseURL": "https://api.example/v1", **provider},
                "judge": {"baseURL": "http://127.0.0.1:1/v1"},
            },
        }
    )


def test_used_providers_name_their_first_model() -> None:
    assert used_providers(spec()) == {"openai": "gpt-x", "judge": "j-1"}


def test_unset_or_empty_key_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALKUBE_PROVIDER_OPENAI_KEY_FILE", raising=False)
    monkeypatch.setenv("PREFLIGHT_KEY", "")
    (problem,) = check_providers(spec(apiKeyEnv="PREFLIGHT_KEY"))
    assert problem.startswith("run.spec.providers.openai.apiKeyEnv: the environment variable")
    monkeypatch.setenv("PREFLIGHT_KEY", "sk-1")
    assert check_providers(spec(apiKeyEnv="PREFLIGHT_KEY")) == []


def test_key_file_must_be_readable_and_not_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    monkeypatch.setenv("EVALKUBE_PROVIDER_OPENAI_KEY_FILE", str(key))
    assert "cannot be read" in check_providers(spec())[0]
    key.write_text("\n")
    assert "is empty" in check_providers(spec())[0]
    key.write_text("sk-1\n")
    assert check_providers(spec()) == []


def test_base_url_must_be_http() -> None:
    (problem,) = check_providers(spec(baseURL="api.example/v1"))
    assert problem.startswith("run.spec.providers.openai.baseURL: 'api.example/v1' is not an")
