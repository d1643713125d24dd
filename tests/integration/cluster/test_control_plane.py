"""Smoke tests proving the loopback control plane (tests/cluster) is a real Kubernetes.

Each test works in its own fresh namespace (fixture ``cluster_namespace``) on the one
session-wide control plane (fixture ``control_plane``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.ctrlplane import (
    COMPLETE_ANNOTATION,
    HOLD_ANNOTATION,
    ControlPlane,
    KubectlError,
)

# startup of the session control plane (~10-20 s) is charged to the first test's timeout
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CHART = Path(__file__).resolve().parents[2] / "cluster" / "fixtures" / "chart"
FAKE_IMAGE = "example.invalid/evalkube/fake:1"  # never pulled: kwok runs no containers

RESTRICTED_SECURITY = {
    "pod": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "container": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    },
}


def versions(cp: ControlPlane) -> dict[str, str]:
    out = {}
    for line in (cp.bin / "VERSIONS").read_text().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def job(
    name: str, ns: str, *, annotations: dict[str, str] | None = None, backoff_limit: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "backoffLimit": backoff_limit,
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "grader",
                            "image": FAKE_IMAGE,
                            "command": ["python3", "-c", "print(42)"],
                        }
                    ],
                },
            },
        },
    }


def job_condition(cp: ControlPlane, ns: str, name: str) -> str | None:
    """'Complete' / 'Failed' once the Job controller set that condition True, else None."""
    obj = cp.kubectl_json("get", "job", name, "-n", ns)
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return str(c["type"])
    return None


def job_pods(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    return list(
        cp.kubectl_json("get", "pods", "-n", ns, "-l", f"batch.kubernetes.io/job-name={name}")[
            "items"
        ]
    )


# ------------------------------------------------------------------------------------------------


def test_versions_are_stamped(control_plane: ControlPlane) -> None:
    want = versions(control_plane)
    kv = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert kv["serverVersion"]["gitVersion"] == want["kubernetes"]
    assert kv["clientVersion"]["gitVersion"] == want["kubernetes"]
    helm = control_plane.run("helm", "version", "--short")
    assert helm.returncode == 0, helm.stderr
    assert helm.stdout.startswith(want["helm"]), helm.stdout
    etcd = control_plane.run("etcd", "--version")
    assert want["etcd"].lstrip("v") in etcd.stdout, etcd.stdout


def test_namespace(control_plane: ControlPlane) -> None:
    name = "smoke-namespace"
    control_plane.kubectl("create", "namespace", name)
    try:
        ns = control_plane.kubectl_json("get", "namespace", name)
        assert ns["status"]["phase"] == "Active"
        # the controller-manager gives every namespace its default ServiceAccount and root CA
        control_plane.wait_for(
            lambda: (
                control_plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode
                == 0
            ),
            what="default ServiceAccount",
            timeout=30,
        )
        control_plane.wait_for(
            lambda: (
                control_plane.kubectl(
                    "get", "cm", "kube-root-ca.crt", "-n", name, check=False
                ).returncode
                == 0
            ),
            what="kube-root-ca.crt",
            timeout=30,
        )
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.evalkube.io
spec:
  group: smoke.evalkube.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [minReplicas, maxReplicas]
            properties:
              minReplicas: {type: integer, minimum: 0}
              maxReplicas: {type: integer, minimum: 0}
            x-kubernetes-validations:
            - rule: self.minReplicas <= self.maxReplicas
              message: minReplicas must not exceed maxReplicas
"""


def widget(ns: str, name: str, lo: int, hi: int) -> dict[str, Any]:
    return {
        "apiVersion": "smoke.evalkube.io/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minReplicas": lo, "maxReplicas": hi},
    }


def test_crd_cel_validation(control_plane: ControlPlane, cluster_namespace: str) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(CRD)
    cp.kubectl(
        "wait", "--for=condition=Established", "crd/widgets.smoke.evalkube.io", "--timeout=60s"
    )
    # discovery may lag Established by a moment: retry the first create until the type is served
    cp.wait_for(lambda: cp.apply(widget(ns, "good", 1, 3)), what="Widget served", timeout=30)
    with pytest.raises(KubectlError) as err:
        cp.apply(widget(ns, "bad", 5, 2))
    assert "minReplicas must not exceed maxReplicas" in err.value.stderr
    assert cp.kubectl("get", "widget", "bad", "-n", ns, check=False).returncode != 0
    # the rule also guards updates of a stored object
    with pytest.raises(KubectlError) as err:
        cp.kubectl(
            "patch", "widget", "good", "-n", ns, "--type=merge", "-p", '{"spec":{"minReplicas":9}}'
        )
    assert "minReplicas must not exceed maxReplicas" in err.value.stderr


def test_job_runs_to_completion_on_kwok_node(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(job("smoke", ns))
    cond = cp.wait_for(lambda: job_condition(cp, ns, "smoke"), what="Job finished", timeout=90)
    assert cond == "Complete"
    pods = job_pods(cp, ns, "smoke")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"  # created by the Job controller
    assert pod["spec"]["nodeName"] == cp.node_name  # bound by the scheduler
    assert pod["status"]["phase"] == "Succeeded"  # driven by kwok
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    status = cp.kubectl_json("get", "job", "smoke", "-n", ns)["status"]
    assert status.get("succeeded") == 1


def test_garbage_collection_via_owner_reference(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.kubectl("create", "configmap", "owner", "-n", ns, "--from-literal=a=1")
    uid = cp.kubectl_json("get", "configmap", "owner", "-n", ns)["metadata"]["uid"]
    cp.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dependent",
                "namespace": ns,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
                ],
            },
            "data": {"b": "2"},
        }
    )
    cp.kubectl("delete", "configmap", "owner", "-n", ns, "--cascade=background")
    cp.wait_for(
        lambda: cp.kubectl("get", "configmap", "dependent", "-n", ns, check=False).returncode != 0,
        what="garbage collector to delete the dependent",
        timeout=60,
    )


def pod(name: str, ns: str, *, privileged: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": FAKE_IMAGE}
    spec: dict[str, Any] = {"containers": [container]}
    if privileged:
        container["securityContext"] = {"privileged": True}
    else:
        container["securityContext"] = RESTRICTED_SECURITY["container"]
        spec["securityContext"] = RESTRICTED_SECURITY["pod"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def test_pod_security_restricted_namespace(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.kubectl(
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    with pytest.raises(KubectlError) as err:
        cp.apply(pod("privileged", ns, privileged=True))
    assert "violates PodSecurity" in err.value.stderr
    assert "privileged" in err.value.stderr
    cp.wait_for(
        lambda: cp.apply(pod("compliant", ns, privileged=False)),
        what="compliant pod admitted (default ServiceAccount may lag)",
        timeout=30,
    )
    cp.wait_for(
        lambda: (
            cp.kubectl_json("get", "pod", "compliant", "-n", ns)["status"].get("phase") == "Running"
        ),
        what="compliant pod Running on the kwok node",
        timeout=60,
    )


def test_kwok_hold_then_release(control_plane: ControlPlane, cluster_namespace: str) -> None:
    """A Job pod annotated evalkube.io/kwok-hold stays Running until the test marks it done."""
    cp, ns = control_plane, cluster_namespace
    hold = {HOLD_ANNOTATION: "true"}
    cp.apply([job("held-ok", ns, annotations=hold), job("held-fail", ns, annotations=hold)])

    def running_pod(name: str) -> str | None:
        pods = job_pods(cp, ns, name)
        if pods and pods[0]["status"].get("phase") == "Running":
            return str(pods[0]["metadata"]["name"])
        return None

    ok_pod = cp.wait_for(lambda: running_pod("held-ok"), what="held-ok Running", timeout=60)
    fail_pod = cp.wait_for(lambda: running_pod("held-fail"), what="held-fail Running", timeout=60)
    # held: a Job created after them without the annotation completes; these do not
    cp.apply(job("unheld", ns))
    assert cp.wait_for(lambda: job_condition(cp, ns, "unheld"), timeout=60, what="unheld") == (
        "Complete"
    )
    assert running_pod("held-ok") == ok_pod
    assert job_condition(cp, ns, "held-ok") is None

    cp.kubectl("annotate", "pod", ok_pod, "-n", ns, f"{COMPLETE_ANNOTATION}=true")
    cp.kubectl("annotate", "pod", fail_pod, "-n", ns, f"{COMPLETE_ANNOTATION}=fail")
    assert (
        cp.wait_for(lambda: job_condition(cp, ns, "held-ok"), timeout=60, what="held-ok finished")
        == "Complete"
    )
    assert (
        cp.wait_for(
            lambda: job_condition(cp, ns, "held-fail"), timeout=60, what="held-fail finished"
        )
        == "Failed"
    )
    failed = cp.kubectl_json("get", "pod", fail_pod, "-n", ns)
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1


def test_helm_lint_template_and_server_dry_run(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace
    lint = cp.run("helm", "lint", "--strict", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    tpl = cp.run("helm", "template", "smoke", str(CHART), "--namespace", ns)
    assert tpl.returncode == 0, tpl.stderr
    rendered = tpl.stdout
    for kind in ("ServiceAccount", "ConfigMap", "Role", "RoleBinding", "Service", "Deployment"):
        assert f"kind: {kind}\n" in rendered
    want = versions(cp)["kubernetes"]
    minor = want.split(".")[1]
    assert f'kubeVersion: "v1.{minor}.0"' in rendered  # helm's default capabilities are stamped
    # the namespace's default ServiceAccount must exist for server-side admission of the objects
    out = cp.wait_for(
        lambda: cp.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=rendered),
        what="server dry-run",
        timeout=30,
    ).stdout
    assert "deployment.apps/smoke-evalkube-smoke created (server dry run)" in out, out
    # a dry run persists nothing
    assert (
        cp.kubectl("get", "deployment", "smoke-evalkube-smoke", "-n", ns, check=False).returncode
        != 0
    )
    # and the server really validates: a bad value is rejected by the apiserver, not by helm
    bad = cp.run("helm", "template", "smoke", str(CHART), "--namespace", ns, "--set", "replicas=-1")
    assert bad.returncode == 0, bad.stderr
    rej = cp.kubectl(
        "apply", "--dry-run=server", "-n", ns, "-f", "-", input=bad.stdout, check=False
    )
    assert rej.returncode != 0, rej.stdout
    assert "spec.replicas" in rej.stderr, rej.stderr
