"""What the Python side hands the native proxy: its configuration and where it finds it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evalkube.proxy.native import native_binary, native_config, uses_local_provider
from evalkube.proxy.upstream import Provider


def test_configuration_names_key_sources_never_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALKUBE_TEST_NATIVE_KEY", "sk-never-in-the-config-0000")
    provider = Provider(
        "openai",
        "https://api.openai.com/v1",
        api_key_env="EVALKUBE_TEST_NATIVE_KEY",
        api_key_file="/var/run/secrets/evalkube/providers/openai/key",
        headers={"OpenAI-Organization": "org-1"},
        timeout=30.0,
    )
    config = native_config(
        {"openai": provider},
        listen="unix:/run/bridge/model.sock",
        control_listen="unix:/run/control/control.sock",
        control_token_file=tmp_path / "token",
        judge_model="openai:gpt-4.1-mini",
        max_calls=8,
        planned_executions=100,
        unit_id="qa.m.00001",
        retries=2,
    )
    text = json.dumps(config)
    assert "sk-never-in-the-config" not in text
    assert config["providers"]["openai"] == {
        "base_url": "https://api.openai.com/v1",
        "api_key_env": "EVALKUBE_TEST_NATIVE_KEY",
        "api_key_file": "/var/run/secrets/evalkube/providers/openai/key",
        "headers": {"OpenAI-Organization": "org-1"},
        "timeout": 30.0,
        "api": "responses",
    }
    assert config["control_token_file"] == str(tmp_path / "token")
    assert (config["max_calls"], config["planned_executions"], config["unit_id"]) == (
        8,
        100,
        "qa.m.00001",
    )
    assert config["embedding_model"] is None


def test_binary_from_the_environment_or_path(tmp_path: Path) -> None:
    binary = tmp_path / "evalkube-proxy"
    binary.write_text("#!/bin/sh\n")
    assert native_binary({"EVALKUBE_PROXY_BIN": str(binary), "PATH": ""}) is None  # not executable
    binary.chmod(0o755)
    assert native_binary({"EVALKUBE_PROXY_BIN": str(binary), "PATH": ""}) == str(binary)
    assert native_binary({"PATH": str(tmp_path)}) == str(binary)
    assert native_binary({"PATH": str(tmp_path / "elsewhere")}) in (None, beside_python())


def beside_python() -> str | None:
    candidate = Path(sys.executable).parent / "evalkube-proxy"
    return str(candidate) if candidate.exists() else None


def test_binary_beside_this_python_is_found_without_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "bin" / "evalkube-proxy"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(binary.parent / "python"))
    assert native_binary({"PATH": str(tmp_path / "elsewhere")}) == str(binary)


def test_local_models_are_recognised() -> None:
    assert uses_local_provider(None, "local:all-minilm-l6-v2")
    assert not uses_local_provider("openai:gpt-4.1", None, "localhost:m")
