"""The proxy's egress settings: the gateway URL and grant file go together, reach the native
configuration, and the grant is read again when its file changes."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalkube.proxy.egress import EgressGateway, EgressUnavailable
from evalkube.proxy.native import native_config
from evalkube.proxy.settings import ProxySettings


def test_gateway_and_grant_file_go_together(tmp_path: Path) -> None:
    assert ProxySettings().egress() is None
    with pytest.raises(ValidationError, match="together"):
        ProxySettings(egress_proxy="http://10.0.0.1:3128")
    with pytest.raises(ValidationError, match="together"):
        ProxySettings(egress_grant_file=tmp_path / "grant")
    for url in ("https://10.0.0.1:3128", "http://user:pw@10.0.0.1:3128", "http://10.0.0.1/x"):
        with pytest.raises(ValidationError, match="http://host:port"):
            ProxySettings(egress_proxy=url, egress_grant_file=tmp_path / "grant")
    settings = ProxySettings(egress_proxy="http://10.0.0.1:3128", egress_grant_file=tmp_path / "g")
    gateway = settings.egress()
    assert gateway is not None
    assert str(gateway.proxy) == "http://10.0.0.1:3128"


def test_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKUBE_PROXY_EGRESS_PROXY", "http://10.0.0.2:3128")
    monkeypatch.setenv("EVALKUBE_PROXY_EGRESS_GRANT_FILE", "/var/run/secrets/evalkube/egress/grant")
    settings = ProxySettings()
    assert settings.egress_grant_file == Path("/var/run/secrets/evalkube/egress/grant")


def test_native_configuration_carries_them() -> None:
    config = native_config(
        {},
        listen="127.0.0.1:0",
        egress_proxy="http://10.0.0.1:3128",
        egress_grant_file=Path("/run/grant"),
    )
    assert config["egress_proxy"] == "http://10.0.0.1:3128"
    assert config["egress_grant_file"] == "/run/grant"
    assert native_config({}, listen="127.0.0.1:0")["egress_proxy"] is None


def test_the_grant_is_read_again_when_its_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "grant"
    gateway = EgressGateway("http://10.0.0.1:3128", path)
    with pytest.raises(EgressUnavailable, match=f"egress grant {path} unreadable"):
        gateway.grant()
    path.write_text("v1.first.mac\n")
    assert gateway.grant() == "v1.first.mac"
    basic = base64.b64decode(gateway.proxy_authorization().removeprefix("Basic "))
    assert basic == b"evalkube:v1.first.mac"
    staging = tmp_path / "grant.new"
    staging.write_text("v1.second.mac")
    os.replace(staging, path)  # as kubelet swaps a Secret's files
    assert gateway.grant() == "v1.second.mac"
    path.write_text("")
    with pytest.raises(EgressUnavailable, match="empty"):
        gateway.proxy_authorization()
