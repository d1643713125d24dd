"""OperatorSettings: the namespaces the operator watches (the chart's ``watchNamespaces``)."""

from __future__ import annotations

import pytest

from evalkube.controller.settings import OperatorSettings


def test_watched_namespaces_merge_the_list_and_the_single_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert OperatorSettings().watched_namespaces() == []  # every namespace
    monkeypatch.setenv("EVALKUBE_NAMESPACES", '["team-a", "team-b"]')
    assert OperatorSettings().watched_namespaces() == ["team-a", "team-b"]
    monkeypatch.setenv("EVALKUBE_NAMESPACE", "team-a")  # the older single form, no repeat
    assert OperatorSettings().watched_namespaces() == ["team-a", "team-b"]
    monkeypatch.setenv("EVALKUBE_NAMESPACE", "team-c")
    assert OperatorSettings().watched_namespaces() == ["team-a", "team-b", "team-c"]
