"""Pure parts of the model bridge: budgets, usage ledger, key scrubbing, parsing, providers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from evalkube import limits
from evalkube.models import ConfigError
from evalkube.models.run import EvalRunSpec
from evalkube.proxy.budgets import BudgetExhausted, Budgets, UnknownExecution
from evalkube.proxy.metrics import ProxyMetrics
from evalkube.proxy.providers import key_file_env, load_run_spec, providers_from_spec
from evalkube.proxy.service import ProxyService
from evalkube.proxy.upstream import (
    Provider,
    ProviderAuth,
    Upstream,
    UpstreamError,
    retry_after_seconds,
    scrub,
    split_model,
)
from evalkube.proxy.usage import UsageLedger, token_usage

pytestmark = pytest.mark.timeout(10)


def test_budget_per_execution_then_per_unit() -> None:
    budgets = Budgets()
    budgets.configure_unit("u", 2, 2)
    budgets.open(["a", "b", "c", "d"])
    budgets.acquire("a")
    budgets.acquire("a")
    with pytest.raises(
        BudgetExhausted, match=r"^model call budget of 2 exhausted for this execution$"
    ):
        budgets.acquire("a")
    budgets.acquire("b")
    budgets.acquire("c")
    with pytest.raises(BudgetExhausted) as unit:
        budgets.acquire("d")
    assert unit.value.scope == "unit"
    assert str(unit.value) == (
        "model call budget of 4 exhausted for this work unit (2 calls x 2 executions)"
    )
    assert budgets.snapshot()["used"] == 4
    assert budgets.snapshot()["refused"] == {"execution": 1, "unit": 1}


def test_unplanned_unit_has_only_the_execution_budget() -> None:
    budgets = Budgets(1)
    budgets.open([f"e{n}" for n in range(100)])
    for n in range(100):
        budgets.acquire(f"e{n}")
    assert budgets.snapshot()["total"] is None


def test_forged_and_reused_tokens_are_refused_and_charge_nobody() -> None:
    budgets = Budgets()
    budgets.configure_unit("u", 2, 1)
    budgets.open(["honest"])
    for n in range(10):  # guessed tokens, sample ids, the unit id
        with pytest.raises(UnknownExecution):
            budgets.acquire(f"forged-{n}")
    with pytest.raises(UnknownExecution):
        budgets.acquire("u")
    budgets.acquire("honest")
    budgets.acquire("honest")  # the honest execution still has its whole budget
    assert budgets.snapshot()["used"] == 2
    budgets.close(["honest"])
    with pytest.raises(UnknownExecution):
        budgets.acquire("honest")  # closed: a leaked token is worth nothing afterwards
    with pytest.raises(ValueError, match="only once"):
        budgets.open(["x", "x"])
    budgets.open(["y"])
    with pytest.raises(ValueError, match="only once"):
        budgets.open(["y"])


def test_configure_unit_closes_every_token() -> None:
    budgets = Budgets()
    budgets.open(["t"])
    budgets.configure_unit("next", 5, 5)
    with pytest.raises(UnknownExecution):
        budgets.acquire("t")
    assert budgets.snapshot()["refused"] == {"unknown_execution": 1}
    budgets.configure_unit("after", 5, 5)
    assert budgets.snapshot()["refused"] == {}  # each unit reports its own


def test_usage_ledger_takes_and_removes() -> None:
    ledger = UsageLedger()
    ledger.record("e", "judge", latency_ms=1.23456, response_id="r1", tokens={"input_tokens": 3})
    ledger.record("e", "embedding", latency_ms=2, tokens={"prompt_tokens": 4}, ok=False)
    assert ledger.take(["e", "missing"]) == {
        "e": {
            "calls": 2,
            "errors": 1,
            "response_ids": ["r1"],
            "usage": {"input_tokens": 3, "prompt_tokens": 4},
            "latency_ms": [1.235, 2],
            "by_purpose": {"judge": 1, "embedding": 1},
            "retries": 0,
        }
    }
    assert len(ledger) == 0


def test_token_usage_keeps_integers_only() -> None:
    answer = {"usage": {"input_tokens": 2, "output_tokens": True, "total_tokens": "9", "x": 1}}
    assert token_usage(answer) == {"input_tokens": 2}
    assert token_usage({"usage": None}) == {}


def test_scrub_removes_the_key_and_key_shapes() -> None:
    text = "bad key sk-abcdefgh123 and Bearer sk-live-zzzzzzzzzzzz and mysecretvalue"
    cleaned = scrub(text, ["mysecretvalue"])
    assert "abcdefgh123" not in cleaned
    assert "zzzz" not in cleaned
    assert "mysecret" not in cleaned
    assert cleaned.count("[redacted]") == 3


def test_retry_after_forms() -> None:
    assert retry_after_seconds("2.5") == 2.5
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("garbage") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412470.0) == 10.0


def test_split_model() -> None:
    assert split_model("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    assert split_model("local:all-minilm-l6-v2") == ("local", "all-minilm-l6-v2")
    with pytest.raises(UpstreamError, match="not `provider:model`"):
        split_model("gpt-4")


def test_provider_key_file_wins_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKUBE_TEST_KEY", "from-env")
    key = tmp_path / "k"
    provider = Provider("p", "http://x", api_key_env="EVALKUBE_TEST_KEY", api_key_file=str(key))
    assert provider.api_key() == "from-env"
    key.write_text("from-file\n")
    assert provider.api_key() == "from-file"
    key.write_text("rotated-file\n")
    os.utime(key, ns=(1, 1))  # even with an old timestamp: size/inode changed
    assert provider.api_key() == "rotated-file"
    assert ProviderAuth(provider).headers()["Authorization"] == "Bearer rotated-file"


def test_provider_auth_refuses_to_call_without_a_configured_key() -> None:
    provider = Provider("p", "http://x", api_key_env="EVALKUBE_TEST_UNSET_VARIABLE")
    with pytest.raises(UpstreamError, match="no API key for provider p: environment variable"):
        ProviderAuth(provider).headers()
    open_provider = Provider("ollama", "http://x", headers={"Authorization": "x", "X-A": "1"})
    assert ProviderAuth(open_provider).headers() == {
        "X-A": "1",
        "Content-Type": "application/json",
    }


def test_providers_from_spec_key_conventions(tmp_path: Path) -> None:
    spec = EvalRunSpec.model_validate(
        {
            "models": ["openai:gpt-4.1-mini", "azure-eu:gpt"],
            "providers": {
                "openai": {
                    "baseURL": "https://api.example/v1",
                    "credentialsSecretRef": {"name": "s", "key": "api-key"},
                    "apiKeyEnv": "OPENAI_API_KEY",
                },
                "azure-eu": {"baseURL": "https://az.example/v1", "apiKeyEnv": "AZ_KEY"},
            },
        }
    )
    providers = providers_from_spec(
        spec,
        {
            "EVALKUBE_PROVIDER_KEYS_DIR": str(tmp_path),
            key_file_env("azure-eu"): "/mnt/az/key",
        },
    )
    assert key_file_env("azure-eu") == "EVALKUBE_PROVIDER_AZURE_EU_KEY_FILE"
    assert providers["openai"].api_key_file == str(tmp_path / "openai")
    assert providers["openai"].api_key_env == "OPENAI_API_KEY"
    assert providers["azure-eu"].api_key_file == "/mnt/az/key"
    assert providers_from_spec(spec, {})["openai"].api_key_file == (
        "/var/run/secrets/evalkube/providers/openai"
    )


def test_load_run_spec_forms(tmp_path: Path) -> None:
    full = tmp_path / "run.yaml"
    full.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: r}\n"
        "spec: {models: ['precomputed'], judgeModel: 'local:x'}\n"
    )
    bare = tmp_path / "spec.json"
    bare.write_text('{"models": ["precomputed"], "embeddingModel": "local:all-minilm-l6-v2"}')
    assert load_run_spec(full).judge_model == "local:x"
    assert load_run_spec(bare).embedding_model == "local:all-minilm-l6-v2"


def test_load_run_spec_reads_within_the_file_bounds(tmp_path: Path) -> None:
    """The run spec is a file like a run file: regular (a FIFO without a writer does not
    hang the open), at most ``SUITE_FILE_BYTES``, its aliases within the YAML budget."""
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"spec.fifo: is a FIFO \(named pipe\)"):
        load_run_spec(fifo)
    large = tmp_path / "large.yaml"
    large.write_text("models: [precomputed]\n#" + "x" * limits.SUITE_FILE_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"large\.yaml: larger than 16,777,216 bytes"):
        load_run_spec(large)
    loop = tmp_path / "loop.yaml"
    loop.write_text("models: [precomputed]\nloop: &l [*l]\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml: refused: .*recursive alias"):
        load_run_spec(loop)


def test_model_resolution_rules() -> None:
    async def check() -> None:
        upstream = Upstream({"openai": Provider("openai", "http://x")})
        service = ProxyService(
            upstream,
            judge_model="openai:gpt-judge",
            embedding_model=None,
            max_calls_per_execution=1,
            planned_executions=1,
        )
        assert service.resolve_model("responses", "auto") == ("openai", "gpt-judge")
        assert service.resolve_model("responses", "gpt-x") == ("openai", "gpt-x")
        assert service.resolve_model("embeddings", "text-e") == ("openai", "text-e")
        assert service.resolve_model("embeddings", "local:m") == ("local", "m")
        with pytest.raises(ValueError, match="embeddingModel"):
            service.resolve_model("embeddings", None)
        with pytest.raises(ValueError, match="must be a string"):
            service.resolve_model("responses", 42)
        await service.aclose()

    asyncio.run(check())


def test_metrics_use_the_given_registry_and_prefix() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry)
    metrics.call("judge", "openai", "ok", 0.01)
    metrics.add_tokens("judge", {"input_tokens": 3})
    text = metrics.exposition().decode()
    names = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert names
    assert all(name.startswith("evalkube_proxy_") for name in names)
    assert (
        registry.get_sample_value(
            "evalkube_proxy_model_calls_total",
            {"purpose": "judge", "provider": "openai", "outcome": "ok"},
        )
        == 1.0
    )
    ProxyMetrics(CollectorRegistry())  # a second proxy in the same process does not collide


def test_run_spec_loads_from_a_pod_snapshot(tmp_path: Path) -> None:
    """The proxy sidecar reads the run's snapshot ConfigMap, as the runner does."""
    from evalkube.models.snapshot import RunSnapshot

    snapshot = tmp_path / "snapshot.json"
    doc = RunSnapshot.model_validate(
        {
            "run": {"namespace": "ns", "name": "r", "uid": "u", "run_id": "ns.r.u"},
            "suite": {
                "name": "qa",
                "version": "sha256:x",
                "spec": {"tasks": [{"id": "t", "dataset": {"rows": [{"a": "1"}]},
                                    "prompt": "{{ item.a }}",
                                    "grader": {"type": "string_check", "operation": "eq",
                                               "input": "{{ sample.output_text }}",
                                               "reference": "{{ item.a }}"}}]},
            },
            "run_spec": {"models": ["precomputed"], "judgeModel": "openai:gpt-4.1-mini",
                         "providers": {"openai": {"baseURL": "http://127.0.0.1:1/v1"}}},
        }
    )  # fmt: skip
    snapshot.write_text(doc.to_json())
    spec = load_run_spec(snapshot)
    assert spec.judge_model == "openai:gpt-4.1-mini"
    assert spec.providers["openai"].base_url == "http://127.0.0.1:1/v1"
