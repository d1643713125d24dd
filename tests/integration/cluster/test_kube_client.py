"""The operator's API calls against the real API server: objects are created from plain dict
manifests (no typed model in between) and come back as the server stored them; a second
create of the same name says it existed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from tests.cluster.plugin import ControlPlane

from evalkube.controller.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _manifests(ns: str) -> list[dict[str, Any]]:
    meta = {"namespace": ns, "labels": {"app.kubernetes.io/name": "evalkube"}}
    container = {"name": "c", "image": "busybox", "command": ["true"]}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {**meta, "name": "cm"},
            "data": {"suite.json": '{"a": 1}', "note": "ünïcode ✓"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {**meta, "name": "token"},
            "type": "Opaque",
            "stringData": {"token": "s3cret"},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {**meta, "name": "unit"},
            "spec": {
                "backoffLimit": 2,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {**meta, "name": "policy"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": []},
        },
    ]


def test_plain_manifests_are_created_as_sent_and_a_second_create_says_it_existed(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace

    async def create_twice() -> list[tuple[Any, Any]]:
        kube = Kube(AsyncClient(config=KubeConfig.from_file(str(cp.kubeconfig))))
        try:
            out = []
            for manifest in _manifests(ns):
                first = await kube.create_object(manifest)
                again = await kube.create(manifest)
                out.append((first, again))
            return out
        finally:
            await kube.close()

    results = asyncio.run(create_twice())
    for manifest, (created, again) in zip(_manifests(ns), results, strict=True):
        kind = manifest["kind"]
        assert type(created) is dict, (kind, type(created))
        assert created["metadata"]["uid"], kind
        assert created["metadata"]["labels"] == manifest["metadata"]["labels"], kind
        assert again is False, kind
        stored = cp.kubectl_json("get", kind.lower(), manifest["metadata"]["name"], "-n", ns)
        assert stored["metadata"]["uid"] == created["metadata"]["uid"], kind
    config_map, secret, job, policy = (created for created, _ in results)
    assert config_map["data"] == {"suite.json": '{"a": 1}', "note": "ünïcode ✓"}
    assert secret["data"] == {"token": "czNjcmV0"}  # base64 of the stringData
    assert job["spec"]["backoffLimit"] == 2
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["true"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
