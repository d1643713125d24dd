"""The Helm chart (charts/evalkube) against a real API server and a real helm.

``helm lint``; ``helm template`` rendered with several value sets and applied with
``kubectl apply --dry-run=server`` (CRDs applied first, namespaces created first); the values
that cannot work fail at render time; the chart's CRD copy matches the generator; a real
``helm install`` whose RBAC is checked with ``kubectl auth can-i`` (least privilege).
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.cluster.ctrlplane import ControlPlane

from evalkube.controller import crds
from evalkube.controller.settings import OperatorSettings

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "evalkube"
ENV_NAMES = {
    "EVALKUBE_RUNNER_IMAGE",
    "EVALKUBE_SANDBOX_IMAGE",
    "EVALKUBE_RUNTIME_CLASS",
    "EVALKUBE_SHARD_SIZE",
    "EVALKUBE_PARALLELISM",
    "EVALKUBE_PROXY_ENGINE",
    "EVALKUBE_IPV6",
    "EVALKUBE_GRADER_LOG_BYTES",
    "EVALKUBE_STORE_URL",
    "EVALKUBE_INGEST_URL",
    "EVALKUBE_LISTEN",
    "EVALKUBE_API_LISTEN",
    "EVALKUBE_API_TOKEN",
}


def helm(cp: ControlPlane, *args: str) -> str:
    proc = cp.run("helm", *args, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def render(
    cp: ControlPlane, namespace: str, *sets: str, release: str = "ev"
) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    return [d for d in yaml.safe_load_all(helm(cp, *args)) if d]


def by_kind(
    docs: list[dict[str, Any]], kind: str, component: str | None = None
) -> list[dict[str, Any]]:
    """Documents of ``kind`` (with label ``app.kubernetes.io/component=component`` if given)."""
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]


@pytest.fixture(scope="module")
def chart_crds(control_plane: ControlPlane) -> ControlPlane:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    for name in (
        "evalsuites.evalkube.io",
        "evalruns.evalkube.io",
        "evalschedules.evalkube.io",
        "clusterkopfpeerings.kopf.dev",
    ):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"evk-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


# -- static ---------------------------------------------------------------------------------


def test_helm_lint(control_plane: ControlPlane) -> None:
    out = helm(control_plane, "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out
    out = helm(
        control_plane, "lint", str(CHART), "--strict",
        "--set", "replicas=3,store.type=postgres,store.postgres.existingSecret=pg",
        "--set", "watchNamespace=team-a,metrics.serviceMonitor.enabled=true",
        "--set", "prometheusRule.enabled=true,grafanaDashboard.enabled=true",
    )  # fmt: skip
    assert "0 chart(s) failed" in out


def test_chart_crds_are_the_generated_ones() -> None:
    assert crds.check_crds(CHART / "crds") == []
    for crd in crds.all_crds():
        on_disk = (CHART / "crds" / crds.crd_filename(crd)).read_text()
        assert on_disk == (ROOT / "crds" / crds.crd_filename(crd)).read_text()


def test_defaults_render_a_locked_down_operator(control_plane: ControlPlane) -> None:
    docs = render(control_plane, "evalkube-system")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
        "Deployment", "Deployment", "NetworkPolicy", "NetworkPolicy", "PersistentVolumeClaim",
        "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Secret", "Service", "Service",
        "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ]  # fmt: skip
    [deploy] = by_kind(docs, "Deployment", "operator")
    pod = deploy["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}  # one SQLite writer
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert set(env) >= ENV_NAMES
    assert env["EVALKUBE_RUNTIME_CLASS"] == "gvisor"
    assert env["EVALKUBE_STORE_URL"] == "sqlite:////var/lib/evalkube/results.db"
    assert env["EVALKUBE_INGEST_URL"] == "http://ev-evalkube.evalkube-system.svc:8080"
    assert env["EVALKUBE_LISTEN"] == "0.0.0.0:8080"
    assert env["EVALKUBE_RUNNER_IMAGE"] == "ghcr.io/evalkube/evalkube:0.1.0"
    assert env["EVALKUBE_SANDBOX_IMAGE"] == "ghcr.io/evalkube/evalkube-sandbox:0.1.0"
    assert env["EVALKUBE_PEERING"] == "false"
    assert env["EVALKUBE_PROXY_ENGINE"] == "auto"
    assert env["EVALKUBE_IPV6"] == "disable"
    assert OperatorSettings(ipv6=env["EVALKUBE_IPV6"]).ipv6 == "disable"
    assert int(env["EVALKUBE_GRADER_LOG_BYTES"]) == 1 << 20
    assert "EVALKUBE_NAMESPACE" not in env
    labels = json.loads(env["EVALKUBE_OPERATOR_POD_LABELS"])
    assert labels.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert env["EVALKUBE_API_LISTEN"] == "0.0.0.0:8081"
    [secret] = by_kind(docs, "Secret", "api-token")
    assert env["EVALKUBE_API_TOKEN"] == {
        "secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}
    }
    assert len(secret["data"]["token"]) >= 48  # a random token, base64
    assert container["readinessProbe"]["httpGet"]["port"] == "api"  # probes stay off ingest
    [service] = by_kind(docs, "Service", "operator")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"http": 8080, "api": 8081}
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]


def test_operator_network_policy_keeps_work_pods_on_the_ingest_port(
    control_plane: ControlPlane,
) -> None:
    """Work-unit pods (untrusted graders) may reach the ingest port only, never the samples
    API; the API port is open to ``networkPolicy.apiFrom``."""
    docs = render(
        control_plane,
        "evalkube-system",
        "networkPolicy.apiFrom[0].namespaceSelector.matchLabels.team=observability",
    )
    [policy] = by_kind(docs, "NetworkPolicy", "operator")
    [deploy] = by_kind(docs, "Deployment", "operator")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    ingest, api = spec["ingress"]
    assert ingest["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert ingest["from"] == [
        {
            "namespaceSelector": {},
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/component": "work-unit",
                    "app.kubernetes.io/managed-by": "evalkube",
                }
            },
        }
    ]
    assert api["ports"] == [{"protocol": "TCP", "port": 8081}]
    assert api["from"] == [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    assert not by_kind(render(control_plane, "evalkube-system", "networkPolicy.enabled=false"),
                       "NetworkPolicy", "operator")  # fmt: skip


def test_egress_gateway_renders_locked_down(control_plane: ControlPlane) -> None:
    docs = render(control_plane, "evalkube-system")
    [operator] = by_kind(docs, "Deployment", "operator")
    [gateway] = by_kind(docs, "Deployment", "egress-gateway")
    [service] = by_kind(docs, "Service", "egress-gateway")
    [operator_service] = by_kind(docs, "Service", "operator")
    [key] = by_kind(docs, "Secret", "egress-grant-key")
    [policy] = by_kind(docs, "NetworkPolicy", "egress-gateway")
    pod = gateway["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # same image as the operator, the gateway mode of the native binary
    assert container["image"] == operator["spec"]["template"]["spec"]["containers"][0]["image"]
    command = container["command"]
    assert command[:2] == ["evalkube-proxy", "gateway"]
    assert command[command.index("--listen") + 1] == "0.0.0.0:3128"
    assert "169.254.0.0/16" in command[command.index("--deny-cidrs") + 1].split(",")
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"]["limits"]["memory"]
    # one key Secret, mounted into the operator (to sign) and the gateway (to verify)
    key_name = key["metadata"]["name"]
    assert len(base64.b64decode(key["data"]["key"])) == 64
    for deployment in (operator, gateway):
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert key_name in {v.get("secret", {}).get("secretName") for v in volumes}
    # the operator's selectors never pick the gateway's pods, and the other way round
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    operator_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert not operator_service["spec"]["selector"].items() <= gateway_labels.items()
    assert not service["spec"]["selector"].items() <= operator_labels.items()
    assert service["spec"]["selector"].items() <= gateway_labels.items()
    # the operator's view of the gateway
    env = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["EVALKUBE_EGRESS_VIA_GATEWAY"] == "true"
    assert (
        env["EVALKUBE_EGRESS_GATEWAY_URL"] == "http://ev-evalkube-egress.evalkube-system.svc:3128"
    )
    assert json.loads(env["EVALKUBE_EGRESS_GATEWAY_POD_LABELS"]).items() <= gateway_labels.items()
    # the policy canary: the gateway's metrics port, open to every pod (below) but not allowed
    # by a run's policy, so a runner that still reaches it knows the policy is not enforced
    assert env["EVALKUBE_POLICY_CANARY_URL"] == "http://ev-evalkube-egress.evalkube-system.svc:9090"
    # its own policy: the proxy port from work-unit pods only; DNS and anywhere out
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    proxy_rule = next(
        r for r in spec["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 3128}]
    )
    [source] = proxy_rule["from"]
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "work-unit"
    assert any(p["port"] == 53 for r in spec["egress"] for p in r.get("ports", []))
    metrics_rule = next(
        r for r in spec["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 9090}]
    )
    assert "from" not in metrics_rule
    # the operator may read these two Services, nothing else
    [role] = by_kind(docs, "Role")
    [rule] = role["rules"]
    assert rule["resources"] == ["services"]
    assert rule["verbs"] == ["get"]
    assert sorted(rule["resourceNames"]) == ["ev-evalkube", "ev-evalkube-egress"]


def test_egress_can_be_turned_off_or_use_an_existing_key(control_plane: ControlPlane) -> None:
    docs = render(control_plane, "evalkube-system", "egress.enabled=false")
    assert not by_kind(docs, "Deployment", "egress-gateway")
    assert not by_kind(docs, "Secret", "egress-grant-key")
    assert not by_kind(docs, "NetworkPolicy", "egress-gateway")
    [operator] = by_kind(docs, "Deployment", "operator")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EVALKUBE_EGRESS_VIA_GATEWAY"] == "false"
    assert "EVALKUBE_EGRESS_GATEWAY_URL" not in env
    assert "EVALKUBE_POLICY_CANARY_URL" not in env
    docs = render(control_plane, "evalkube-system", "egress.verifyPolicy=false")
    [operator] = by_kind(docs, "Deployment", "operator")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert "EVALKUBE_POLICY_CANARY_URL" not in {e["name"] for e in container["env"]}
    docs = render(control_plane, "evalkube-system", "egress.grantKey.existingSecret=mine")
    assert not by_kind(docs, "Secret", "egress-grant-key")
    for deployment in by_kind(docs, "Deployment"):
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert "mine" in {v.get("secret", {}).get("secretName") for v in volumes}


def test_rbac_is_least_privilege(control_plane: ControlPlane) -> None:
    docs = render(control_plane, "evalkube-system")
    rules = [r for role in by_kind(docs, "ClusterRole") for r in role["rules"]]
    verbs: dict[str, set[str]] = {}
    for rule in rules:
        for resource in rule["resources"]:
            verbs.setdefault(resource, set()).update(rule["verbs"])
    assert "*" not in {v for vs in verbs.values() for v in vs}
    assert verbs["secrets"] == {"create", "patch"}  # never read: no get, list or watch
    assert "pods" not in verbs  # the operator never reads pods
    assert verbs["jobs"] == {"list", "watch", "create"}  # ownerReferences delete them
    assert verbs["networkpolicies"] == {"create"}
    # grader files are watched (an edit re-checks the suites); ConfigMaps hold no secrets
    assert verbs["configmaps"] == {"get", "list", "watch", "create"}
    assert verbs["events"] == {"create"}
    assert verbs["evalruns/status"] == {"get", "patch"}
    # kopf and the operator patch: `update` only where an admission plugin asks for it
    assert {r for r, vs in verbs.items() if "update" in vs} == {
        "evalruns/finalizers",
        "evalschedules/finalizers",
    }
    # delete only EvalRuns, those a schedule's history limits drop
    assert {r for r, vs in verbs.items() if "delete" in vs} == {"evalruns"}
    assert "namespaces" not in verbs
    # peering only with several replicas
    assert "clusterkopfpeerings" not in verbs
    assert "kopfpeerings" not in verbs
    docs = render(
        control_plane, "evalkube-system",
        "replicas=2,store.type=postgres,store.postgres.existingSecret=pg",
    )  # fmt: skip
    resources = {r for role in by_kind(docs, "ClusterRole") for rule in role["rules"]
                 for r in rule["resources"]}  # fmt: skip
    assert {"clusterkopfpeerings", "kopfpeerings"} <= resources


def test_watch_namespaces_renders_roles_only(control_plane: ControlPlane) -> None:
    """watchNamespaces: a Role and RoleBinding in each namespace, nothing cluster-wide, and
    the operator told the same list (kopf namespace-scoped)."""
    docs = render(
        control_plane,
        "evalkube-system",
        "watchNamespaces={team-a,team-b}",
        "replicas=2,store.type=postgres,store.postgres.existingSecret=pg",
    )
    assert not by_kind(docs, "ClusterRole")
    assert not by_kind(docs, "ClusterRoleBinding")
    runs_roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "ev-evalkube-runs"]
    assert sorted(r["metadata"]["namespace"] for r in runs_roles) == ["team-a", "team-b"]
    bindings = {b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")}
    assert {"team-a", "team-b"} <= bindings
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    [operator] = by_kind(docs, "Deployment", "operator")
    env = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["EVALKUBE_NAMESPACES"]) == ["team-a", "team-b"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replicas=2"], "replicas=2 needs store.type=postgres"),
        # the values schema (values.schema.json) refuses these before any template renders
        (["store.type=postgres"], "at '/store/postgres/existingSecret': minLength"),
        (["store.type=mysql"], "at '/store/type': value must be one of 'sqlite', 'postgres'"),
        (["work.parallelism=0"], "at '/work/parallelism': minimum: got 0, want 1"),
    ],
)
def test_impossible_values_fail_at_render(
    control_plane: ControlPlane, sets: list[str], message: str
) -> None:
    args = ["template", "ev", str(CHART)]
    for item in sets:
        args += ["--set", item]
    proc = control_plane.run("helm", *args)
    assert proc.returncode != 0
    assert message in proc.stderr


# -- against the API server ----------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["runtimeClassName=", "store.sqlite.storageClass=fast,store.sqlite.size=1Gi"],
        ["replicas=2", "store.type=postgres", "store.postgres.existingSecret=pg"],
        ["replicas=2", "store.type=postgres", "store.postgres.existingSecret=pg", "WATCH"],
        ["grafanaDashboard.enabled=true"],
    ],
    ids=["defaults", "sqlite-options", "peering-cluster", "peering-namespaced", "dashboard"],
)
def test_rendered_chart_is_accepted_by_the_api_server(
    chart_crds: ControlPlane, namespace: str, sets: list[str]
) -> None:
    cp = chart_crds
    sets = [f"watchNamespace={namespace}" if s == "WATCH" else s for s in sets]
    # restricted Pod Security: the operator's pod template must not even warn
    cp.kubectl(
        "label", "namespace", namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )  # fmt: skip
    args = ["template", f"ev{uuid.uuid4().hex[:6]}", str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    manifest = helm(cp, *args)
    proc = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps" in proc.stdout
    assert "created (server dry run)" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr
    if "grafanaDashboard.enabled=true" in sets:
        assert "configmap/ev" in proc.stdout
        assert "-evalkube-dashboard created (server dry run)" in proc.stdout
    if "replicas=2" in sets:
        kind = (
            "kopfpeering"
            if any(s.startswith("watchNamespace") for s in sets)
            else "clusterkopfpeering"
        )
        assert f"{kind}.kopf.dev/evalkube created" in proc.stdout


def test_install_and_rbac_with_can_i(chart_crds: ControlPlane, namespace: str) -> None:
    cp = chart_crds
    release = f"ev{uuid.uuid4().hex[:6]}"
    helm(cp, "install", release, str(CHART), "--namespace", namespace)
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-evalkube"

        def can(verb: str, resource: str, ns: str = "team-x") -> bool:
            out = cp.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", sa, check=False)
            return out.stdout.strip() == "yes"

        assert can("create", "jobs.batch")
        assert can("create", "networkpolicies.networking.k8s.io")
        assert can("create", "secrets")
        assert can("patch", "evalruns.evalkube.io/status")
        assert can("watch", "evalsuites.evalkube.io")
        assert can("create", "events")
        assert can("get", "configmaps")
        # Secrets are never read, here or in kube-system
        for ns in ("team-x", "kube-system"):
            for verb in ("get", "list", "watch"):
                assert not can(verb, "secrets", ns)
        assert can("watch", "configmaps")
        assert not can("delete", "jobs.batch")
        assert not can("delete", "networkpolicies.networking.k8s.io")
        assert not can("update", "evalruns.evalkube.io")
        assert not can("get", "pods")
        assert not can("list", "namespaces")
        assert not can("patch", "clusterkopfpeerings.kopf.dev")
        assert not can("delete", "pods")
        assert not can("create", "pods")
        assert not can("create", "deployments.apps")
        # an EvalSchedule's runs: created per scheduled time, deleted beyond the history limits
        assert can("create", "evalruns.evalkube.io")
        assert can("delete", "evalruns.evalkube.io")
        assert can("patch", "evalschedules.evalkube.io/status")
        assert not can("delete", "evalsuites.evalkube.io")
        assert not can("delete", "evalschedules.evalkube.io")
        assert not can("create", "rolebindings.rbac.authorization.k8s.io")
        # the ClusterIPs of its own Service and the gateway's, and of no other Service
        assert can("get", f"services/{release}-evalkube-egress", namespace)
        assert not can("get", "services/kubernetes", "default")
        assert not can("list", "services", namespace)
        status = helm(cp, "status", release, "--namespace", namespace, "-o", "json")
        assert json.loads(status)["info"]["status"] == "deployed"
    finally:
        cp.run("helm", "uninstall", release, "--namespace", namespace)


def _operator_client(cp: ControlPlane, namespace: str, account: str) -> httpx.Client:
    """HTTP straight to the apiserver with the account's token: PATCH and POST as the
    operator's client sends them (kubectl would GET first)."""
    token = cp.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    return httpx.Client(
        base_url=cp.server,
        verify=ssl.create_default_context(cafile=str(cp.workdir / "pki" / "ca.crt")),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_namespaced_install_can_i(chart_crds: ControlPlane, namespace: str) -> None:
    """watchNamespaces on the real apiserver: the operator may work in the listed namespaces
    only, and holds nothing cluster-wide."""
    cp = chart_crds
    release = f"ev{uuid.uuid4().hex[:6]}"
    watched, other = f"{namespace}-a", f"{namespace}-b"
    for ns in (watched, other):
        cp.kubectl("create", "namespace", ns)
    helm(
        cp,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        f"watchNamespaces={{{watched}}}",
    )
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-evalkube"

        def can(verb: str, resource: str, ns: str | None) -> bool:
            where = ["-n", ns] if ns else ["--all-namespaces"]
            out = cp.kubectl("auth", "can-i", verb, resource, *where, "--as", sa, check=False)
            return out.stdout.strip() == "yes"

        for verb, resource in [
            ("create", "jobs.batch"),
            ("list", "jobs.batch"),
            ("create", "secrets"),
            ("watch", "evalruns.evalkube.io"),
            ("patch", "evalsuites.evalkube.io/status"),
            ("create", "events"),
            ("get", "configmaps"),
            ("watch", "configmaps"),
            ("watch", "jobs.batch"),
        ]:
            assert can(verb, resource, watched), (verb, resource)
            assert not can(verb, resource, other), (verb, resource)
            assert not can(verb, resource, None), (verb, resource)
        assert not can("get", "secrets", watched)
        assert not can("list", "customresourcedefinitions.apiextensions.k8s.io", None)
        assert not can("list", "namespaces", None)
        assert not cp.kubectl_json(
            "get", "clusterroles", "-l", f"app.kubernetes.io/instance={release}"
        )["items"]
    finally:
        cp.run("helm", "uninstall", release, "--namespace", namespace)
        for ns in (watched, other):
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_secret_policy_confines_the_operators_secret_writes(
    chart_crds: ControlPlane, namespace: str
) -> None:
    """RBAC lets the operator patch Secrets (the grant renewal), and a PATCH answers with the
    whole Secret: the chart's admission policy refuses any write to a Secret that is not one of
    its runs' (so it can neither read nor change kube-system's), and allows its own."""
    cp = chart_crds
    release = f"ev{uuid.uuid4().hex[:6]}"
    helm(cp, "install", release, str(CHART), "--namespace", namespace)
    refusal = "may only create and patch the Secrets of its EvalRuns"
    merge = {"Content-Type": "application/merge-patch+json"}
    try:
        cp.kubectl("create", "secret", "generic", "precious", "-n", namespace,
                   "--from-literal=password=hunter2")  # fmt: skip
        cp.kubectl("create", "secret", "generic", "evk-test-precious", "-n", "kube-system",
                   "--from-literal=password=hunter2")  # fmt: skip
        cp.apply({
            "apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun",
            "metadata": {"name": "nightly", "namespace": namespace},
            "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]},
        })  # fmt: skip
        uid = cp.kubectl_json("get", "evalrun", "nightly", "-n", namespace)["metadata"]["uid"]
        owner = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", "name": "nightly",
                 "uid": uid}  # fmt: skip
        ours = {"app.kubernetes.io/managed-by": "evalkube",
                "app.kubernetes.io/component": "ingest-token"}  # fmt: skip

        def secret(name: str, labels: dict[str, str], owners: list[Any]) -> dict[str, Any]:
            meta = {"name": name, "labels": labels, "ownerReferences": owners}
            return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                    "stringData": {"token": "t"}}  # fmt: skip

        with _operator_client(cp, namespace, f"{release}-evalkube") as api:
            base = f"/api/v1/namespaces/{namespace}/secrets"
            # the API server enforces a new policy once its informer has it: wait with a dry
            # run (admission runs, nothing is stored) that the policy must refuse
            cp.wait_for(
                lambda: (
                    api.post(f"{base}?dryRun=All", json=secret("probe", {}, [])).status_code
                    in (403, 422)
                ),
                timeout=30,
                what="the Secret admission policy in force",
            )
            # what the operator makes: created, then patched in place
            made = api.post(base, json=secret("nightly-ingest", ours, [owner]))
            assert made.status_code == 201, made.text
            patched = api.patch(f"{base}/nightly-ingest", headers=merge,
                                json={"stringData": {"token": "u"}})  # fmt: skip
            assert patched.status_code == 200, patched.text
            # anything else is refused, naming the rule
            for body in (
                secret("plain", {}, []),
                secret("unowned", ours, []),
                secret("other", {**ours, "app.kubernetes.io/component": "x"}, [owner]),
            ):
                refused = api.post(base, json=body)
                assert refused.status_code in (403, 422), refused.text
                assert refusal in refused.text
            # a patch (even an empty one) of a Secret it did not make: refused, nothing read
            for where in (
                f"{base}/precious",
                "/api/v1/namespaces/kube-system/secrets/evk-test-precious",
            ):
                refused = api.patch(where, headers=merge, json={})
                assert refused.status_code in (403, 422), refused.text
                assert refusal in refused.text
                assert "aHVudGVyMg" not in refused.text  # base64 of the password
                assert api.get(where).status_code == 403  # and no read either
            # nor can it take one of its own Secrets out of the policy's reach
            unlabel = {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}}
            refused = api.patch(f"{base}/nightly-ingest", headers=merge, json=unlabel)
            assert refused.status_code in (403, 422), refused.text
    finally:
        cp.run("helm", "uninstall", release, "--namespace", namespace)
        cp.kubectl("delete", "secret", "evk-test-precious", "-n", "kube-system", check=False)
