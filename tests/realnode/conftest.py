"""Fixtures of the real-node tier: the chart installed once per session on the real node, and
a fresh namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.realnode import RealNode
from tests.realnode.support import install_chart


@pytest.fixture(scope="session")
def evalkube_on_node(real_node: RealNode) -> RealNode:
    """The real node with evalkube installed by ``helm install`` (operator Ready)."""
    install_chart(real_node)
    return real_node


@pytest.fixture
def node_namespace(evalkube_on_node: RealNode) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:8]}"
    evalkube_on_node.kubectl("create", "namespace", name)
    yield name
    evalkube_on_node.kubectl("delete", "namespace", name, "--wait=false", check=False)
