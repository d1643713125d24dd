"""Which cluster ``evalkube submit`` talks to: ``--kubeconfig``, ``$KUBECONFIG`` (its first
file that exists), ``~/.kube/config``; ``--context``; the context's namespace."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evalkube.models import ConfigError
from evalkube.submit.cluster import kubeconfig


def write_config(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "dev",
                "clusters": [
                    {"name": "dev", "cluster": {"server": "https://dev.example:6443"}},
                    {"name": "prod", "cluster": {"server": "https://prod.example:6443"}},
                ],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "dev", "context": {"cluster": "dev", "user": "me"}},
                    {
                        "name": "prod",
                        "context": {"cluster": "prod", "user": "me", "namespace": "evals"},
                    },
                ],
            }
        )
    )
    return path


def test_the_current_context_or_the_one_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "config")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{config}")
    current = kubeconfig(None, None)
    assert (current.cluster.server, current.namespace) == ("https://dev.example:6443", "default")
    prod = kubeconfig(None, "prod")
    assert (prod.cluster.server, prod.namespace) == ("https://prod.example:6443", "evals")
    with pytest.raises(ConfigError, match="Context 'staging' not found"):
        kubeconfig(None, "staging")


def test_the_flag_wins_and_home_is_the_last_resort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    write_config(tmp_path / ".kube" / "config")
    assert kubeconfig(None, None).cluster.server == "https://dev.example:6443"
    other = write_config(tmp_path / "other.yaml")
    assert kubeconfig(str(other), "prod").cluster.server == "https://prod.example:6443"
    with pytest.raises(ConfigError, match=r"--kubeconfig .*nowhere: no such file"):
        kubeconfig(str(tmp_path / "nowhere"), None)
