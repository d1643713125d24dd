"""Ingest auth from durable state, on the real apiserver: an operator replica that never
reconciled a run (a standby behind the Service, or any replica right after a restart)
accepts that run's posts with its token, checked against the token's SHA-256 in the EvalRun's
status (the operator never reads Secrets); a finished run takes none; another run's token and
unknown runs are refused."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from lightkube import AsyncClient, KubeConfig
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import install_crds

from evalkube.controller import names
from evalkube.controller.api import ApiServer
from evalkube.controller.kube import Kube
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunRegistry, digest
from evalkube.controller.run_reconciler import TOKEN_DIGEST_FIELD, RunReconciler
from evalkube.controller.settings import OperatorSettings
from evalkube.store import ResultStore, RunRecord

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOKEN = "the-runs-ingest-token"


def _apply_run(cp: ControlPlane, namespace: str, name: str, token: str) -> str:
    cp.apply(
        [
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalRun",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": names.token_secret_name(name), "namespace": namespace},
                "data": {"token": base64.b64encode(token.encode()).decode()},
            },
        ]
    )
    # what the operator records when it creates the token (runs.TOKEN_DIGEST_FIELD)
    status = json.dumps({"status": {TOKEN_DIGEST_FIELD: digest(token)}})
    cp.kubectl(
        "patch", "evalrun", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", status,
    )  # fmt: skip
    uid: str = cp.kubectl_json("get", "evalrun", name, "-n", namespace)["metadata"]["uid"]
    return names.run_id(namespace, name, uid)


def test_a_replica_that_never_reconciled_the_run_accepts_its_posts(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    run_id = _apply_run(cp, ns, "nightly", TOKEN)
    _apply_run(cp, ns, "weekly", "another-runs-token")
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    store.create_run(RunRecord(run_id, "qa", "sha256:x", {}, "pod"))
    sample = {
        "sample_id": "s_1",
        "task_id": "qa",
        "model": "precomputed",
        "seq": 0,
        "status": "valid",
        "scores": {"score": 1.0},
    }
    base = f"/api/v1/namespaces/{ns}/evalruns"

    async def serve_once(calls: list[tuple[str, str]]) -> list[int]:
        client = AsyncClient(config=KubeConfig.from_file(str(cp.kubeconfig)))
        kube = Kube(client)
        registry = RunRegistry()  # this replica has reconciled nothing
        metrics = OperatorMetrics()
        reconciler = RunReconciler(kube, store, registry, metrics, OperatorSettings())
        api = ApiServer(store, registry, metrics, resolve=reconciler.resolve_run)
        statuses = []
        try:
            async with TestClient(TestServer(api.ingest_app)) as http:
                for name, token in calls:
                    response = await http.post(
                        f"{base}/{name}/samples",
                        json={"samples": [sample]},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    statuses.append(response.status)
        finally:
            await kube.close()
        return statuses

    try:
        assert asyncio.run(
            serve_once(
                [
                    ("nightly", TOKEN),
                    ("nightly", "another-runs-token"),
                    ("weekly", TOKEN),
                    ("missing", TOKEN),
                ]
            )
        ) == [200, 401, 401, 401]  # a missing run answers as a wrong token does
        assert [s.sample_id for s in store.iter_samples(run_id)] == ["s_1"]
        # once the run is finished, a late runner's posts are refused by any replica
        cp.kubectl(
            "patch", "evalrun", "nightly", "-n", ns, "--subresource=status", "--type=merge",
            "-p", '{"status": {"phase": "Succeeded"}}',
        )  # fmt: skip
        assert asyncio.run(serve_once([("nightly", TOKEN)])) == [401]
    finally:
        store.close()
