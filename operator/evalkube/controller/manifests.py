"""Pure builders of the Kubernetes objects the operator creates (unit-tested without a cluster).

A work-unit Pod has three containers with three levels of trust (DESIGN.md §2, §5):
the ``proxy`` native sidecar holds the provider credentials (only it mounts the Secret);
the ``runner`` holds the run's ingest token; the ``grader`` runs untrusted code under gVisor
with no token, no secrets, no service-account token, a read-only root, no capabilities and
a size-capped /tmp. The Pod satisfies Pod Security "restricted". ``proxy`` and ``grader``
are native sidecars (init containers that keep running): the runner is the only main
container, so the Pod completes when it exits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any, cast

import kopf

from evalkube._net import url_port
from evalkube.controller import names
from evalkube.controller.settings import OperatorSettings
from evalkube.engine.plan import Unit
from evalkube.models import EvalRunSpec
from evalkube.models.snapshot import RunSnapshot
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT, STDLIB, cluster_image

SNAPSHOT_DIR = "/etc/evalkube/snapshot"
DATASETS_DIR = "/etc/evalkube/datasets"
BRIDGE_DIR = "/run/evalkube/bridge"
CONTROL_DIR = "/run/evalkube/control"
WORKER_DIR = "/run/evalkube/worker"
PROVIDER_KEYS_DIR = "/var/run/secrets/evalkube/providers"
BRIDGE_SOCKET = f"{BRIDGE_DIR}/bridge.sock"
CONTROL_SOCKET = f"{CONTROL_DIR}/control.sock"
WORKER_SOCKET = f"{WORKER_DIR}/worker.sock"
TOKEN_KEY = "token"
EGRESS_GRANT_DIR = "/var/run/secrets/evalkube/egress"
EGRESS_GRANT_KEY = "grant"
#: Where the sandbox image keeps ``evalkube_sandbox`` (isolated mode ignores PYTHONPATH).
SANDBOX_PACKAGE_DIR = "/opt/evalkube"


def sandbox_bootstrap(environment: str | None) -> str:
    """The grader container's bootstrap: the worker package first; the image's grader
    environment (:data:`INSIDE_ENVIRONMENT`) after the standard library, unless the task asks
    for ``stdlib``."""
    inside = "" if environment == STDLIB else f"sys.path.append({INSIDE_ENVIRONMENT!r}); "
    return (
        f"import sys, runpy; sys.path.insert(0, {SANDBOX_PACKAGE_DIR!r}); {inside}"
        "runpy.run_module('evalkube_sandbox', run_name='__main__')"
    )


NOBODY = 65534
#: Prefix of gVisor's per-volume mount hints (``<prefix>.<volume>.share`` / ``.type``).
GVISOR_MOUNT_ANNOTATION = "dev.gvisor.spec.mount"


def _labels(run_name: str, component: str) -> dict[str, str]:
    """What the run's objects are labelled with, and the run's policy selects its pods by."""
    return {names.LABEL_RUN: names.run_label(run_name), names.LABEL_COMPONENT: component}


def _meta(owner: Mapping[str, Any], name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": {
            **_labels(owner["metadata"]["name"], component),
            names.LABEL_MANAGED_BY: names.MANAGED_BY,
        },
        # deleting the EvalRun deletes what it owns
        "ownerReferences": [kopf.build_owner_reference(cast(kopf.Body, owner))],
    }


def _restricted(**extra: Any) -> dict[str, Any]:
    """Pod Security "restricted": the pod's securityContext, a container's with ``extra``."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NOBODY,
        "runAsGroup": NOBODY,
        "seccompProfile": {"type": "RuntimeDefault"},
        **extra,
    }


def snapshot_config_map(owner: Mapping[str, Any], snapshot: RunSnapshot) -> dict[str, Any]:
    """The immutable snapshot a run executes: suite spec, sources, datasets, run spec."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, names.snapshot_name(owner["metadata"]["name"]), "snapshot"),
        "immutable": True,
        "data": {"snapshot.json": snapshot.to_json()},
    }


def _secret(
    owner: Mapping[str, Any], name_of: Callable[[str], str], component: str, data: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(owner, name_of(owner["metadata"]["name"]), component),
        "type": "Opaque",
        "stringData": data,
    }


def token_secret(owner: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The run's ingest bearer token (only the runner container reads it)."""
    return _secret(owner, names.token_secret_name, "ingest-token", {TOKEN_KEY: token})


def egress_grant_secret(owner: Mapping[str, Any], grant: str) -> dict[str, Any]:
    """The run's egress grant (:mod:`evalkube.controller.egress`): only the proxy container
    mounts it, so only the proxy gets through the egress gateway."""
    return _secret(owner, names.egress_grant_secret_name, "egress-grant", {EGRESS_GRANT_KEY: grant})


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def _to_operator_pods(
    settings: OperatorSettings, pod_labels: Mapping[str, str], port: int
) -> dict[str, Any]:
    """An egress rule to the pods labelled ``pod_labels`` in the operator's namespace."""
    namespace = {"kubernetes.io/metadata.name": settings.operator_namespace}
    pods = {
        "namespaceSelector": {"matchLabels": namespace},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }
    return {"to": [pods], "ports": [_tcp(port)]}


def network_policy(
    owner: Mapping[str, Any], spec: EvalRunSpec, settings: OperatorSettings
) -> dict[str, Any]:
    """No ingress. Egress, with ``egress_via_gateway``: only the egress gateway's port on its
    pods and the operator's ingest port, no DNS, no address block: the grader container
    shares this policy with the proxy, and both destinations refuse it without credentials
    only the proxy and runner containers mount (``docs/security.md``).

    Without the gateway (direct egress): DNS, the ingest port, and TCP 443/80 (the providers'
    ports) outside the cluster's private ranges, which the grader inherits as well.
    """
    ingest = _to_operator_pods(settings, settings.operator_pod_labels, settings.ingest_port)
    if settings.egress_via_gateway:
        gateway_port = url_port(settings.egress_gateway_url)
        egress = [
            _to_operator_pods(settings, settings.egress_gateway_pod_labels, gateway_port),
            ingest,
        ]
    else:
        dns = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        egress = [{"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, _tcp(53)]}, ingest]
        ports = sorted({url_port(p.base_url) for p in spec.providers.values()})
        if ports:
            private = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]
            public = {"ipBlock": {"cidr": "0.0.0.0/0", "except": private}}
            egress.append({"to": [public], "ports": [_tcp(port) for port in ports]})
    run_name = owner["metadata"]["name"]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(owner, names.network_policy_name(run_name), "network-policy"),
        "spec": {
            "podSelector": {"matchLabels": _labels(run_name, "work-unit")},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def _mount(volume: str, path: str, read_only: bool = False) -> dict[str, Any]:
    return {"name": volume, "mountPath": path, **({"readOnly": True} if read_only else {})}


def _read_only_volume(
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    name: str,
    path: str,
    source: dict[str, Any],
) -> None:
    """A ConfigMap or Secret volume that one container mounts read-only at ``path``."""
    volumes.append({"name": name, **source})
    mounts.append(_mount(name, path, read_only=True))


def _container(
    name: str,
    *,
    image: str,
    command: list[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    limits: dict[str, str],
    requests: tuple[str, str] = ("100m", "128Mi"),
    sidecar: bool = False,
) -> dict[str, Any]:
    """A container under Pod Security "restricted", with a read-only root; a ``sidecar`` is a
    native one (an init container that keeps running)."""
    return {
        "name": name,
        "image": image,
        **({"restartPolicy": "Always"} if sidecar else {}),
        "command": command,
        "env": env,
        "volumeMounts": mounts,
        "resources": {"limits": limits, "requests": {"cpu": requests[0], "memory": requests[1]}},
        "securityContext": _restricted(
            allowPrivilegeEscalation=False,
            readOnlyRootFilesystem=True,
            capabilities={"drop": ["ALL"]},
        ),
    }


def unit_job(
    owner: Mapping[str, Any],
    unit: Unit,
    *,
    spec: EvalRunSpec,
    settings: OperatorSettings,
    dataset_config_maps: list[tuple[str, str]],
    timeout_seconds: int,
    preprocess_timeout: int = 0,
    model_access: bool = True,
    runner_model_access: bool = False,
    grader_environment: str | None = None,
) -> dict[str, Any]:
    """The Job of one work unit (see the module docstring for the Pod's trust layout).

    The proxy starts with a zero budget for the unit: nothing a grader sends is served until
    the runner configures the unit's budget and opens execution tokens. Without
    ``model_access`` the grader container does not even mount the bridge's socket; with
    ``runner_model_access`` (built-in model graders) the trusted runner mounts it to make their
    calls, charged like ``ctx``'s to execution tokens it opens. The task's
    ``grader.environment`` picks the grader container's image (an image reference) or keeps
    the sandbox image (``default``; ``stdlib`` leaves its environment off ``sys.path``).
    """
    run_name = owner["metadata"]["name"]
    meta = _meta(owner, names.job_name(run_name, unit.unit_id), "work-unit")
    meta["labels"][names.LABEL_UNIT] = meta["name"][-11:]
    meta["annotations"] = {names.ANNOTATION_UNIT_ID: unit.unit_id, names.ANNOTATION_RUN: run_name}
    pod_labels = dict(meta["labels"])
    if spec.queue_name:  # Kueue admits the Job by unsuspending it
        meta["labels"][names.LABEL_KUEUE_QUEUE] = spec.queue_name
    volumes: list[dict[str, Any]] = [
        {"name": "snapshot", "configMap": {"name": names.snapshot_name(run_name)}},
        {"name": "bridge", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "control", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "worker", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": settings.tmp_size}},
        {"name": "runner-tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    proxy_mounts = [
        _mount("snapshot", SNAPSHOT_DIR, read_only=True),
        _mount("bridge", BRIDGE_DIR),
        _mount("control", CONTROL_DIR),
    ]
    proxy_env = _provider_credentials(spec, volumes, proxy_mounts)
    runner_mounts = [
        _mount("snapshot", SNAPSHOT_DIR, read_only=True),
        _mount("control", CONTROL_DIR),
        _mount("worker", WORKER_DIR),
        _mount("runner-tmp", "/tmp"),
    ]
    grader_mounts = [_mount("tmp", "/tmp"), _mount("worker", WORKER_DIR)]
    if runner_model_access:
        runner_mounts.append(_mount("bridge", BRIDGE_DIR, read_only=True))
    if model_access:
        grader_mounts.append(_mount("bridge", BRIDGE_DIR, read_only=True))
    for index, (cm_name, _key) in enumerate(dataset_config_maps):
        dataset = {"configMap": {"name": cm_name}}
        path = f"{DATASETS_DIR}/{cm_name}"
        _read_only_volume(volumes, runner_mounts, f"dataset-{index}", path, dataset)
    proxy_flags = {
        "--listen": f"unix:{BRIDGE_SOCKET}",
        "--control-listen": f"unix:{CONTROL_SOCKET}",
        "--run-spec": f"{SNAPSHOT_DIR}/snapshot.json",
        "--engine": settings.proxy_engine,
        "--unit-id": unit.unit_id,
        "--max-calls": "0",
        "--planned-executions": "0",
    }
    runner_flags = {
        "--snapshot": f"{SNAPSHOT_DIR}/snapshot.json",
        "--unit": unit.unit_id,
        "--ingest-url": settings.ingest_url,
        "--worker": f"unix:{WORKER_SOCKET}",
        "--bridge": f"unix:{BRIDGE_SOCKET}",
        "--bridge-control": f"unix:{CONTROL_SOCKET}",
        "--datasets": DATASETS_DIR,
    }
    if settings.egress_via_gateway:
        # the proxy sends upstream calls through the gateway with the run's grant, which it
        # alone mounts
        proxy_flags["--egress-proxy"] = settings.egress_gateway_url
        proxy_flags["--egress-grant-file"] = f"{EGRESS_GRANT_DIR}/{EGRESS_GRANT_KEY}"
        items = [{"key": EGRESS_GRANT_KEY, "path": EGRESS_GRANT_KEY}]
        grant = {"secret": {"secretName": names.egress_grant_secret_name(run_name), "items": items}}
        _read_only_volume(volumes, proxy_mounts, "egress-grant", EGRESS_GRANT_DIR, grant)
        if settings.policy_canary_url:
            # grader code runs only once the CNI enforces the policy (engine/policy_gate.py)
            runner_flags["--policy-canary"] = settings.policy_canary_url
    # The native proxy's garbage collector works harder as it nears the container's memory
    # limit instead of being OOM-killed (the Python proxy ignores it).
    memory_limit = {"resourceFieldRef": {"containerName": "proxy", "resource": "limits.memory"}}
    proxy = _container(
        "proxy",
        image=settings.runner_image,
        command=["evalkube", "proxy", *chain.from_iterable(proxy_flags.items())],
        env=[*proxy_env, {"name": "GOMEMLIMIT", "valueFrom": memory_limit}],
        mounts=proxy_mounts,
        limits={"memory": settings.proxy_memory},
        requests=("50m", "64Mi"),
        sidecar=True,  # starts first, stops after the runner
    )
    token = {"secretKeyRef": {"name": names.token_secret_name(run_name), "key": TOKEN_KEY}}
    runner = _container(
        "runner",
        image=settings.runner_image,
        command=["evalkube", "unit", *chain.from_iterable(runner_flags.items())],
        env=[
            {"name": "EVALKUBE_INGEST_TOKEN", "valueFrom": token},
            {"name": "EVALKUBE_RUN", "value": f"{owner['metadata']['namespace']}/{run_name}"},
        ],
        mounts=runner_mounts,
        limits={"memory": settings.runner_memory},
    )
    environment_field = f"tasks[{unit.task_id}].grader.environment"
    bootstrap = sandbox_bootstrap(grader_environment)
    grader = _container(
        "grader",
        image=cluster_image(grader_environment, settings.sandbox_image, field=environment_field),
        command=["python3", "-I", "-S", "-c", bootstrap, "--listen", WORKER_SOCKET],
        env=[],
        mounts=grader_mounts,
        limits={"memory": settings.grader_memory, "cpu": settings.grader_cpu},
        # it serves until the runner is done, then the kubelet stops it (as a regular
        # container it kept every finished pod, and its Job, running)
        sidecar=True,
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _restricted(fsGroup=NOBODY),
        "initContainers": [proxy, grader],
        "containers": [runner],
        "volumes": volumes,
    }
    if settings.runtime_class:
        pod_spec["runtimeClassName"] = settings.runtime_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    annotations = {**gvisor_mount_hints(pod_spec), **settings.pod_annotations}
    # the deadline: the worst case of the unit's executions plus slack, capped at a day
    rows = max(1, unit.stop - unit.start) if unit.kind == "shard" else 1
    worst = rows * (timeout_seconds + preprocess_timeout) + settings.active_deadline_slack_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **({"suspend": True} if spec.queue_name else {}),
            "backoffLimit": settings.job_backoff_limit,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds,
            "activeDeadlineSeconds": min(86_400, worst),
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def gvisor_mount_hints(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """gVisor pod annotations that make each memory emptyDir shared by several containers one
    tmpfs inside the sandbox.

    Under runsc every container otherwise sees its own view of an emptyDir, so a unix socket
    one container binds there (worker, bridge, control) is invisible to the others. The hints
    reach runsc only when containerd passes them on (``pod_annotations = ["dev.gvisor.*"]`` on
    the runsc runtime, docs/install.md); other runtimes ignore them.
    """
    containers = [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]
    users = Counter(
        name for c in containers for name in {m["name"] for m in c.get("volumeMounts", [])}
    )
    hints: dict[str, str] = {}
    for volume in pod_spec.get("volumes", []):
        if (volume.get("emptyDir") or {}).get("medium") == "Memory" and users[volume["name"]] > 1:
            prefix = f"{GVISOR_MOUNT_ANNOTATION}.{volume['name']}"
            hints[f"{prefix}.share"] = "pod"
            hints[f"{prefix}.type"] = "tmpfs"
    return hints


def _provider_credentials(
    spec: EvalRunSpec, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Adds the providers' Secret volumes, for the proxy container only; returns the variables
    naming their key files."""
    env = []
    for name, provider in sorted(spec.providers.items()):
        ref = provider.credentials_secret_ref
        if ref is not None:
            secret = {
                "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": "key"}]}
            }
            path = f"{PROVIDER_KEYS_DIR}/{name}"
            _read_only_volume(volumes, mounts, f"provider-{name}", path, secret)
            variable = f"EVALKUBE_PROVIDER_{name.upper().replace('-', '_')}_KEY_FILE"
            env.append({"name": variable, "value": f"{path}/key"})
    return env
