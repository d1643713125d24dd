"""Fixtures of the real-node tier: the chart installed once per session on the real node, and
a fresh namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.realnode import RealNode
from tests.conftest import require
from tests.realnode.support import OUTSIDE_IP, install_chart, outside_netns
from tests.support.s3_server import S3Server, weed_bin


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


@pytest.fixture
def store_outside(evalkube_on_node: RealNode, tmp_path: Path) -> Iterator[S3Server]:
    """SeaweedFS on a host outside the cluster (its own netns, at OUTSIDE_IP)."""
    weed = weed_bin()
    if weed is None or not weed.exists():
        require("SeaweedFS's weed binary is not built (bash .ci/seaweedfs.sh)")
    assert weed is not None
    with (
        outside_netns(evalkube_on_node) as ns,
        S3Server(weed, tmp_path, netns=ns, host=OUTSIDE_IP) as s3,
    ):
        yield s3
