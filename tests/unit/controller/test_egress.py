"""Egress grants minted by the operator (evalkube.controller.egress_grants).

The vectors in tests/fixtures/egress_grants.json are shared with the gateway's Go tests
(operator/evalkube-proxy/grant_test.go): Python must mint exactly the tokens Go verifies.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller.egress_grants import (
    grant_hosts,
    mint_grant,
    read_signing_key,
    service_of,
    url_authority,
    with_host,
)
from evalkube.models import EvalRunSpec

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "egress_grants.json").read_text()
)


@pytest.mark.parametrize("vector", VECTORS["grants"], ids=lambda v: v["name"])
def test_mint_reproduces_the_shared_vectors(vector: dict[str, Any]) -> None:
    token = mint_grant(
        VECTORS["key"].encode(),
        vector["namespace"],
        vector["run"],
        vector["uid"],
        vector["hosts"],
        vector["exp"],
    )
    assert token == vector["token"]
    encoded = token.split(".")[1]
    payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    assert payload == vector["payload"]
    assert json.loads(payload)["hosts"] == vector["granted"]


def test_refused_vectors_are_not_what_python_mints() -> None:
    minted = {vector["token"] for vector in VECTORS["grants"]}
    assert not minted & {vector["token"] for vector in VECTORS["refused"]}


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        mint_grant(b"short", "ns", "run", "uid", ["a:443"], 1)


@pytest.mark.parametrize(
    ("url", "authority"),
    [
        ("https://api.openai.com/v1", "api.openai.com:443"),
        ("http://Fake.Evals.svc.cluster.local:8080/v1", "fake.evals.svc.cluster.local:8080"),
        ("http://fake/v1", "fake:80"),
        ("https://[2001:DB8::1]:8443/v1", "[2001:db8::1]:8443"),
        ("https://user@host.example/v1", "host.example:443"),
    ],
)
def test_url_authority(url: str, authority: str) -> None:
    assert url_authority(url) == authority


@pytest.mark.parametrize("url", ["ftp://host/x", "https:///v1", "host:443"])
def test_url_authority_refuses_non_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        url_authority(url)


def test_grant_hosts_are_the_providers_authorities() -> None:
    spec = EvalRunSpec.model_validate(
        {
            "models": ["openai:gpt-4.1-mini", "fake:m"],
            "providers": {
                "openai": {"baseURL": "https://api.openai.com/v1"},
                "azure": {"baseURL": "https://API.openai.com:443/other"},
                "fake": {"baseURL": "http://fake.evals.svc:8080/v1"},
            },
        }
    )
    assert grant_hosts(spec) == ["api.openai.com:443", "fake.evals.svc:8080"]


def test_read_signing_key_takes_the_first_key(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"\n{VECTORS['key']}\n{VECTORS['other_key']}\n")
    assert read_signing_key(path) == VECTORS["key"].encode()
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no key"):
        read_signing_key(path)
    path.write_text("too-short\n")
    with pytest.raises(ValueError, match="shorter than 32"):
        read_signing_key(path)


@pytest.mark.parametrize(
    ("url", "service"),
    [
        ("http://evalkube.evalkube-system.svc:8080", ("evalkube-system", "evalkube")),
        ("http://evalkube-egress.ops.svc.cluster.local:3128/", ("ops", "evalkube-egress")),
        ("http://10.96.0.10:8080", None),
        ("http://evalkube:8080", None),
        ("http://evalkube.evalkube-system:8080", None),
        ("http://api.example.com:443", None),
    ],
)
def test_service_of_names_only_cluster_service_hosts(
    url: str, service: tuple[str, str] | None
) -> None:
    assert service_of(url) == service


def test_with_host_keeps_scheme_port_and_path() -> None:
    url = "http://evalkube.evalkube-system.svc:8080/api"
    assert with_host(url, "10.96.0.7") == "http://10.96.0.7:8080/api"
    assert with_host("http://gw.ops.svc", "fd00::7") == "http://[fd00::7]"
