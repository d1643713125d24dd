"""The operator's egress wiring on the real control plane (etcd, kube-apiserver, kwok).

With ``EVALKUBE_EGRESS_VIA_GATEWAY`` a run waits (Pending, with the reason) until the grant key
can be read and the gateway's Service exists; then it gets a grant Secret signed with the key
for its providers' hosts, a NetworkPolicy allowing only the gateway and the ingest port, and
Jobs whose proxy goes through the gateway at its Service's ClusterIP (the pods have no DNS).
"""

from __future__ import annotations

import base64
import gc
import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    _free_port,
    _jobs,
    install_crds,
    run_status,
    running_operator,
    suite,
)

from evalkube.controller.egress_grants import mint_grant

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

KEY = "cluster-test-grant-key-0123456789abcdefghijklmnopqrstuvwxyz"


def _reason(cp: ControlPlane, namespace: str) -> str | None:
    status = cp.kubectl_json("get", "evalrun", "nightly", "-n", namespace).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == "Ready" and status.get("phase") == "Pending":
            return str(condition["reason"])
    return None


def test_a_run_goes_through_the_gateway_or_waits_for_it(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    system = f"{ns}-sys"
    cp.kubectl("create", "namespace", system)
    key_file = tmp_path / "grant-key"
    settings = {
        "egress_via_gateway": "true",
        "operator_namespace": system,
        "egress_gateway_url": f"http://evalkube-egress.{system}.svc:3128",
        "egress_grant_key_file": str(key_file),
        "policy_canary_url": f"http://evalkube-egress.{system}.svc:9090",
    }
    try:
        with running_operator(cp, tmp_path / "results.db", _free_port(), **settings):
            cp.apply(suite(ns))
            cp.apply(
                {
                    "apiVersion": "evalkube.io/v1alpha1",
                    "kind": "EvalRun",
                    "metadata": {"name": "nightly", "namespace": ns},
                    "spec": {
                        "suiteRef": {"name": "qa"},
                        "models": ["precomputed"],
                        "shardSize": 10,
                        "providers": {
                            "openai": {"baseURL": "https://API.openai.com/v1"},
                            "fake": {"baseURL": "http://fake.evals.svc:8080/v1"},
                        },
                    },
                }
            )
            # no key yet: Pending with the reason, nothing created for the pods
            cp.wait_for(
                lambda: _reason(cp, ns) == "EgressKeyUnavailable", timeout=30, what="no key"
            )
            assert not _jobs(cp, ns)
            key_file.write_text(KEY + "\n")
            # the key, but no gateway Service: the pods would have no address for it
            cp.wait_for(lambda: _reason(cp, ns) == "ServiceNotFound", timeout=30, what="no Service")
            assert not _jobs(cp, ns)
            cp.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "evalkube-egress", "namespace": system},
                    "spec": {"selector": {"app": "gateway"}, "ports": [{"port": 3128}]},
                }
            )
            ip = cp.kubectl_json("get", "service", "evalkube-egress", "-n", system)["spec"][
                "clusterIP"
            ]
            jobs: dict[str, dict[str, Any]] = cp.wait_for(
                lambda: (j := _jobs(cp, ns)) and j, timeout=60, what="unit Jobs"
            )
            # let the pass that created them finish before the operator stops
            cp.wait_for(lambda: run_status(cp, ns).get("phase") == "Running", what="Running")
            time.sleep(1.0)
    finally:
        cp.kubectl("delete", "namespace", system, "--wait=false", check=False)
        # An operator stopped seconds after it started can drop an API connection that kopf
        # cancelled mid-request; finalize it here, its ResourceWarning ignored, instead of
        # as an "unraisable" error at the end of the session.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()

    # the grant: signed with the key, for the providers' hosts, owned by the run
    evalrun = cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)
    secret = cp.kubectl_json("get", "secret", "nightly-egress-grant", "-n", ns)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == evalrun["metadata"]["uid"]
    grant = base64.b64decode(secret["data"]["grant"]).decode()
    encoded = grant.split(".")[1]
    payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    assert payload["run"] == f"{ns}/nightly"
    assert payload["hosts"] == ["api.openai.com:443", "fake.evals.svc:8080"]
    uid = evalrun["metadata"]["uid"]
    assert grant == mint_grant(KEY.encode(), ns, "nightly", uid, payload["hosts"], payload["exp"])

    # the policy: the gateway and the ingest port, nothing else
    policy = cp.kubectl_json("get", "networkpolicy", "nightly-egress", "-n", ns)["spec"]
    assert [rule["ports"] for rule in policy["egress"]] == [
        [{"protocol": "TCP", "port": 3128}],
        [{"protocol": "TCP", "port": 8080}],
    ]

    # the Job: the proxy goes through the gateway's ClusterIP with the mounted grant
    job = next(iter(jobs.values()))
    pod = job["spec"]["template"]["spec"]
    proxy = next(c for c in pod["initContainers"] if c["name"] == "proxy")
    command = proxy["command"]
    assert command[command.index("--egress-proxy") + 1] == f"http://{ip}:3128"
    assert "egress-grant" in {m["name"] for m in proxy["volumeMounts"]}
    # the runner waits for the policy on the gateway's metrics port, by ClusterIP (no DNS)
    runner = next(c for c in pod["containers"] if c["name"] == "runner")
    assert runner["command"][runner["command"].index("--policy-canary") + 1] == f"http://{ip}:9090"
    for container in pod["containers"]:
        assert "egress-grant" not in {m["name"] for m in container["volumeMounts"]}
