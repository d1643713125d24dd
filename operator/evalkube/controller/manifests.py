"""Pure builders of the Kubernetes objects the operator creates (unit-tested without a cluster).

A work-unit Pod has three containers with three levels of trust (docs/security.md):
the ``proxy`` native sidecar holds the provider credentials (only it mounts the Secret);
the ``runner`` holds the run's ingest token; the ``grader`` runs untrusted code under gVisor
with no token, no secrets, no service-account token, a read-only root, no capabilities and
a size-capped /tmp, as a user of its own (:data:`GRADER_UID`; the runner and the proxy run
as :data:`RUNNER_UID`), with the runner's socket folder mounted read-only. Each container has
an ephemeral-storage limit (its logs); the grader's memory and processes are limited inside
its container (``evalkube_sandbox.serve``). With ``ipv6: disable`` (the default) the Pod
carries the sysctl that turns IPv6 off, which Pod Security "baseline" and "restricted" do not
list as safe; otherwise the Pod satisfies "restricted". ``proxy`` and ``grader`` are native
sidecars (init containers that keep running): the runner is the only main container, so the
Pod completes when it exits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any, cast

import kopf

from evalkube import limits
from evalkube.controller import names
from evalkube.controller.settings import OperatorSettings
from evalkube.engine.plan import Unit
from evalkube.engine.snapshot import PREPARE_UNIT
from evalkube.models import EvalRunSpec
from evalkube.models.snapshot import RunSnapshot
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT, STDLIB, cluster_image
from evalkube.util.net import url_port

SNAPSHOT_DIR = "/etc/evalkube/snapshot"
DATASETS_DIR = "/etc/evalkube/datasets"
BRIDGE_DIR = "/run/evalkube/bridge"
CONTROL_DIR = "/run/evalkube/control"
WORKER_DIR = "/run/evalkube/worker"
#: The native proxy's journal (``--state-dir``), in a volume only the proxy mounts: what the
#: sidecar replays when the kubelet restarts it (about 300 bytes a model call).
PROXY_STATE_DIR = "/run/evalkube/proxy-state"
PROXY_STATE_SIZE = "256Mi"
PROVIDER_KEYS_DIR = "/var/run/secrets/evalkube/providers"
BRIDGE_SOCKET = f"{BRIDGE_DIR}/bridge.sock"
CONTROL_SOCKET = f"{CONTROL_DIR}/control.sock"
WORKER_SOCKET = f"{WORKER_DIR}/worker.sock"
TOKEN_KEY = "token"
EGRESS_GRANT_DIR = "/var/run/secrets/evalkube/egress"
EGRESS_GRANT_KEY = "grant"
#: Where the sandbox image keeps ``evalkube_sandbox`` (isolated mode ignores PYTHONPATH).
SANDBOX_PACKAGE_DIR = "/opt/evalkube"
#: Where a trusted container mounts the PersistentVolumeClaims of the run's ``pvc://``
#: sources (``evalkube.sources.PVC_ROOT``), read-only.
PVC_DIR = "/var/run/evalkube/pvc"
#: Where a trusted container mounts ``spec.storage.caBundleConfigMapRef`` (as ``ca.pem``).
CA_BUNDLE_DIR = "/etc/evalkube/source-ca"


#: The runner's exit code (``evalkube.reporting.console.EXIT_CONFIG``; ``evalkube unit`` and
#: ``evalkube prepare``) when its unit cannot run at all (the snapshot or token unreadable,
#: programs that do not load, a source changed since it was pinned, a ``grade_batch`` past its
#: limits; it reports the reason to the operator first): the Job fails without retrying.
RUNNER_EXIT_UNIT_FAILED = 2
#: :data:`RUNNER_EXIT_UNIT_FAILED` fails the Job: another pod would fail the same way. A Pod
#: evicted, preempted or drained (the ``DisruptionTarget`` condition) failed through no fault of
#: its unit: its retry does not count against ``backoffLimit`` (the next Pod skips what it stored).
JOB_POD_FAILURE_POLICY = {
    "rules": [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": "runner",
                "operator": "In",
                "values": [RUNNER_EXIT_UNIT_FAILED],
            },
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]
}


@dataclass(frozen=True)
class SourceMounts:
    """What a trusted container needs to read the run's ``uri`` sources: the claims of its
    ``pvc://`` sources, and whether it reaches an object store or https:// host (through the
    egress gateway, with the run's grant, and the store's credentials from Secrets)."""

    claims: tuple[str, ...] = ()
    remote: bool = False

    def __bool__(self) -> bool:
        return bool(self.claims) or self.remote


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
#: The grader container's user: its own, so nothing the runner owns is the grader's to
#: change, and ``RLIMIT_NPROC`` counts grader processes only.
GRADER_UID = NOBODY
#: The runner's and the proxy's user (the operator image's; the proxy's control socket is
#: theirs alone). Every container's group is :data:`NOBODY`, the grader reaches the runner's
#: and the bridge's sockets through it.
RUNNER_UID = 65532
#: The sysctl that turns IPv6 off in a Pod (gVisor reads it from the sandbox's spec).
DISABLE_IPV6_SYSCTL = "net.ipv6.conf.all.disable_ipv6"
#: ``ephemeral-storage`` limits (their logs: the roots are read-only) per container.
EPHEMERAL_STORAGE = {"proxy": "256Mi", "runner": "256Mi", "grader": "64Mi"}
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


def _restricted(uid: int = NOBODY, **extra: Any) -> dict[str, Any]:
    """Pod Security "restricted": the pod's securityContext, a container's with ``extra``."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
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


def config_map_bytes(config_map: Mapping[str, Any]) -> int:
    """Bytes of a ConfigMap as Kubernetes counts them against its 1 MiB: every key and value
    of ``data`` (UTF-8) and ``binaryData``."""
    size = 0
    for section in ("data", "binaryData"):
        for key, value in (config_map.get(section) or {}).items():
            size += len(key.encode()) + len(str(value).encode())
    return size


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
    """The run's egress grant (:mod:`evalkube.controller.egress_grants`): only the proxy container
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

    Without the gateway (direct egress): DNS, the ingest port, and the ports of the providers
    and the object store outside the cluster's private ranges, which the grader inherits as
    well (an object store inside the cluster needs the gateway).
    """
    ingest = _to_operator_pods(settings, settings.operator_pod_labels, settings.ingest_port)
    if settings.egress_via_gateway:
        port = url_port(settings.egress_gateway_url)
        egress = [_to_operator_pods(settings, settings.egress_gateway_pod_labels, port), ingest]
    else:
        dns = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        egress = [{"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, _tcp(53)]}, ingest]
        urls = [p.base_url for p in spec.providers.values()]
        if spec.storage is not None and spec.storage.s3 is not None:
            urls.append(spec.storage.s3.endpoint_url or "https://s3.amazonaws.com")
        ports = sorted({url_port(url) for url in urls})
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
    uid: int = RUNNER_UID,
) -> dict[str, Any]:
    """A container under Pod Security "restricted", with a read-only root and a bound on what
    it may write to the node's disk; a ``sidecar`` is a native one (an init container that
    keeps running)."""
    storage = EPHEMERAL_STORAGE[name]
    return {
        "name": name,
        "image": image,
        **({"restartPolicy": "Always"} if sidecar else {}),
        "command": command,
        "env": env,
        "volumeMounts": mounts,
        "resources": {
            "limits": {**limits, "ephemeral-storage": storage},
            "requests": {"cpu": requests[0], "memory": requests[1], "ephemeral-storage": "16Mi"},
        },
        "securityContext": _restricted(
            uid,
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
    sources: SourceMounts = SourceMounts(),
    task_id: str | None = None,
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
        # the proxy's journal: what a restarted proxy sidecar replays (docs/proxy.md)
        {"name": "proxy-state", "emptyDir": {"sizeLimit": PROXY_STATE_SIZE}},
    ]
    proxy_mounts = [
        _mount("snapshot", SNAPSHOT_DIR, read_only=True),
        _mount("bridge", BRIDGE_DIR),
        _mount("control", CONTROL_DIR),
        _mount("proxy-state", PROXY_STATE_DIR),
    ]
    proxy_env = _provider_credentials(spec, volumes, proxy_mounts)
    runner_mounts = [
        _mount("snapshot", SNAPSHOT_DIR, read_only=True),
        _mount("control", CONTROL_DIR),
        _mount("worker", WORKER_DIR),
        _mount("runner-tmp", "/tmp"),
    ]
    # the runner listens in the worker folder: the grader may connect there, never bind
    grader_mounts = [_mount("tmp", "/tmp"), _mount("worker", WORKER_DIR, read_only=True)]
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
        "--state-dir": PROXY_STATE_DIR,
    }
    runner_flags = {
        "--snapshot": f"{SNAPSHOT_DIR}/snapshot.json",
        "--unit": unit.unit_id,
        "--ingest-url": settings.ingest_url,
        "--worker": f"unix:{WORKER_SOCKET}",
        "--bridge": f"unix:{BRIDGE_SOCKET}",
        "--bridge-control": f"unix:{CONTROL_SOCKET}",
        "--datasets": DATASETS_DIR,
        "--ipv6": "allow" if settings.ipv6 == "allow" else "refuse",
        "--ingest-retry-seconds": f"{settings.ingest_retry_seconds:g}",
    }
    if settings.egress_via_gateway:
        # the proxy sends upstream calls through the gateway with the run's grant, which it
        # alone mounts
        proxy_flags["--egress-proxy"] = settings.egress_gateway_url
        proxy_flags["--egress-grant-file"] = f"{EGRESS_GRANT_DIR}/{EGRESS_GRANT_KEY}"
        grant = _grant_volume(run_name)
        _read_only_volume(volumes, proxy_mounts, "egress-grant", EGRESS_GRANT_DIR, grant)
        if settings.policy_canary_url:
            # grader code runs only once the CNI enforces the policy (engine/policy_gate.py)
            runner_flags["--policy-canary"] = settings.policy_canary_url
    # the runner reads the unit's rows from the task's uri sources (the grader never does)
    source_env = _source_access(
        run_name, sources, spec, settings, volumes, runner_mounts, runner_flags
    )
    if task_id is not None:  # whose source pins the runner asks the ingest API for
        runner_flags["--task"] = task_id
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
            *source_env,
        ],
        mounts=runner_mounts,
        limits={"memory": settings.runner_memory},
    )
    environment_field = f"tasks[{unit.task_id}].grader.environment"
    python = ["python3", "-I", "-S", "-c", sandbox_bootstrap(grader_environment)]
    memory = quantity_bytes(settings.grader_memory)
    supervisor_flags = {
        "--connect": WORKER_SOCKET,
        "--memory-bytes": str(memory),
        "--memory-from": "cgroup",
        "--processes": str(limits.SANDBOX_PIDS),
        "--log-bytes": str(settings.grader_log_bytes),
    }
    grader = _container(
        "grader",
        image=cluster_image(grader_environment, settings.sandbox_image, field=environment_field),
        command=[*python, *chain.from_iterable(supervisor_flags.items())],
        env=[],
        mounts=grader_mounts,
        limits={
            "memory": str(memory + limits.SANDBOX_MEMORY_OVERHEAD_BYTES),
            "cpu": settings.grader_cpu,
        },
        # its supervisor ends when the runner closes its connection (as a regular container
        # it kept every finished pod, and its Job, running)
        sidecar=True,
        uid=GRADER_UID,
    )
    pod_spec = _pod_spec(settings, [runner], volumes, init=[proxy, grader])
    deadline = unit_deadline(unit, timeout_seconds, preprocess_timeout, settings)
    return _job(meta, pod_labels, pod_spec, settings, deadline.seconds, bool(spec.queue_name))


def _pod_spec(
    settings: OperatorSettings,
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Pod of a run's Job: no service-account token, no service links, Pod Security
    "restricted" (but for the IPv6 sysctl), the gVisor runtime class, the node selector."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _restricted(fsGroup=NOBODY),
        **({"initContainers": init} if init else {}),
        "containers": containers,
        "volumes": volumes,
    }
    if settings.ipv6 == "disable":
        pod_spec["securityContext"]["sysctls"] = [{"name": DISABLE_IPV6_SYSCTL, "value": "1"}]
    if settings.runtime_class:
        pod_spec["runtimeClassName"] = settings.runtime_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    return pod_spec


def _job(
    meta: dict[str, Any],
    pod_labels: Mapping[str, str],
    pod_spec: dict[str, Any],
    settings: OperatorSettings,
    deadline: int,
    suspend: bool = False,
) -> dict[str, Any]:
    annotations = {**gvisor_mount_hints(pod_spec), **settings.pod_annotations}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **({"suspend": True} if suspend else {}),
            "backoffLimit": settings.job_backoff_limit,
            "podFailurePolicy": JOB_POD_FAILURE_POLICY,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds,
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {"labels": dict(pod_labels), "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def prepare_job(
    owner: Mapping[str, Any],
    *,
    spec: EvalRunSpec,
    settings: OperatorSettings,
    sources: SourceMounts,
) -> dict[str, Any]:
    """The Job that pins the run's ``uri`` sources before any unit is planned: one trusted
    ``runner`` container (``evalkube prepare``) reads each source's metadata (a Parquet
    footer; a JSONL or CSV file once, to count and index its rows) and reports the pins to the
    ingest API, so the operator process never reads rows or holds the store's credentials.
    Its Pod is a work-unit Pod to the run's NetworkPolicy (the same egress, no ingress)."""
    run_name = owner["metadata"]["name"]
    meta = _meta(owner, names.prepare_job_name(run_name), "work-unit")
    meta["annotations"] = {names.ANNOTATION_UNIT_ID: PREPARE_UNIT, names.ANNOTATION_RUN: run_name}
    volumes: list[dict[str, Any]] = [
        {"name": "snapshot", "configMap": {"name": names.snapshot_name(run_name)}},
        {"name": "runner-tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    mounts = [_mount("snapshot", SNAPSHOT_DIR, read_only=True), _mount("runner-tmp", "/tmp")]
    flags = {"--snapshot": f"{SNAPSHOT_DIR}/snapshot.json", "--ingest-url": settings.ingest_url}
    if settings.egress_via_gateway and settings.policy_canary_url:
        flags["--policy-canary"] = settings.policy_canary_url
    source_env = _source_access(run_name, sources, spec, settings, volumes, mounts, flags)
    token = {"secretKeyRef": {"name": names.token_secret_name(run_name), "key": TOKEN_KEY}}
    runner = _container(
        "runner",
        image=settings.runner_image,
        command=["evalkube", "prepare", *chain.from_iterable(flags.items())],
        env=[{"name": "EVALKUBE_INGEST_TOKEN", "valueFrom": token}, *source_env],
        mounts=mounts,
        limits={"memory": settings.runner_memory},
    )
    # under the runtime class too: it parses the sources' bytes, which may be hostile
    pod_spec = _pod_spec(settings, [runner], volumes)
    return _job(meta, meta["labels"], pod_spec, settings, limits.PREPARE_DEADLINE_SECONDS)


@dataclass(frozen=True)
class UnitDeadline:
    """A unit Job's ``activeDeadlineSeconds`` and the worst case it stands for."""

    seconds: int
    worst: int
    """Seconds the unit may need: every execution reaching its timeout, plus the slack."""
    rows: int
    timeout_seconds: int
    """The task's timeouts per row: its graders' ``timeoutSeconds`` and its preprocessor's."""

    @property
    def capped(self) -> bool:
        return self.worst > self.seconds

    def explain(self, settings: OperatorSettings) -> str:
        """What the deadline is made of and what to change, for messages."""
        made_of = (
            f"{self.rows} rows x {self.timeout_seconds} s (the task's timeoutSeconds) + "
            f"{settings.active_deadline_slack_seconds} s"
        )
        if not self.capped:
            return f"its deadline is {self.seconds} s ({made_of})"
        room = self.seconds - settings.active_deadline_slack_seconds
        rows = max(1, room // max(1, self.timeout_seconds))
        return (
            f"its deadline is {self.seconds} s (EVALKUBE_UNIT_DEADLINE_MAX_SECONDS), shorter "
            f"than its worst case of {self.worst} s ({made_of}); a spec.shardSize of at most "
            f"{rows} (or a lower timeoutSeconds) makes the worst case fit"
        )


def unit_deadline(
    unit: Unit, timeout_seconds: int, preprocess_timeout: int, settings: OperatorSettings
) -> UnitDeadline:
    """The deadline of ``unit``'s Job: the worst case of its executions (every row's grader and
    preprocessor run reaching their timeouts; an aggregate unit counts one row) plus
    ``EVALKUBE_ACTIVE_DEADLINE_SLACK_SECONDS``, at most ``EVALKUBE_UNIT_DEADLINE_MAX_SECONDS``."""
    rows = max(1, unit.stop - unit.start) if unit.kind == "shard" else 1
    per_row = timeout_seconds + preprocess_timeout
    worst = rows * per_row + settings.active_deadline_slack_seconds
    return UnitDeadline(min(settings.unit_deadline_max_seconds, worst), worst, rows, per_row)


_QUANTITY_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1,
}  # fmt: skip


def quantity_bytes(quantity: str) -> int:
    """Bytes of a Kubernetes memory quantity (``1Gi``, ``512Mi``, ``1000000``)."""
    text = quantity.strip()
    # the longest suffix the text ends with ("" ends every text)
    suffix = next(s for s in sorted(_QUANTITY_SUFFIXES, key=len, reverse=True) if text.endswith(s))
    try:
        return int(float(text.removesuffix(suffix)) * _QUANTITY_SUFFIXES[suffix])
    except ValueError:
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 1Gi, 512Mi)") from None


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


def _source_access(
    run_name: str,
    sources: SourceMounts,
    spec: EvalRunSpec,
    settings: OperatorSettings,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    flags: dict[str, str],
) -> list[dict[str, Any]]:
    """Adds what reading ``sources`` needs to a trusted container (its ``mounts`` and
    ``flags``; the Pod's ``volumes``): the claims, read-only; the object store's credentials
    as the variables of the AWS chain (from the Secrets ``spec.storage.s3`` names: the grader
    container never has them); and the egress gateway with the run's grant. Returns the env."""
    env: list[dict[str, Any]] = []
    for index, claim in enumerate(sources.claims):
        claim_volume = {"persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        path = f"{PVC_DIR}/{claim}"
        _read_only_volume(volumes, mounts, f"source-pvc-{index}", path, claim_volume)
    if not sources.remote:
        return env
    s3 = spec.storage.s3 if spec.storage is not None else None
    if s3 is not None:
        for variable, ref in (
            ("AWS_ACCESS_KEY_ID", s3.access_key_id_secret_ref),
            ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key_secret_ref),
        ):
            if ref is not None:
                key = {"secretKeyRef": {"name": ref.name, "key": ref.key}}
                env.append({"name": variable, "valueFrom": key})
    bundle = spec.storage.ca_bundle_config_map_ref if spec.storage is not None else None
    if bundle is not None:
        items = [{"key": bundle.key, "path": "ca.pem"}]
        ca = {"configMap": {"name": bundle.name, "items": items}}
        _read_only_volume(volumes, mounts, "source-ca", CA_BUNDLE_DIR, ca)
        flags["--ca-bundle"] = f"{CA_BUNDLE_DIR}/ca.pem"
    if settings.egress_via_gateway:
        if not any(v["name"] == "egress-grant" for v in volumes):
            volumes.append({"name": "egress-grant", **_grant_volume(run_name)})
        mounts.append(_mount("egress-grant", EGRESS_GRANT_DIR, read_only=True))
        flags["--egress-proxy"] = settings.egress_gateway_url
        flags["--egress-grant-file"] = f"{EGRESS_GRANT_DIR}/{EGRESS_GRANT_KEY}"
    return env


def _grant_volume(run_name: str) -> dict[str, Any]:
    """The run's egress grant Secret as a volume source (its one key)."""
    items = [{"key": EGRESS_GRANT_KEY, "path": EGRESS_GRANT_KEY}]
    return {"secret": {"secretName": names.egress_grant_secret_name(run_name), "items": items}}


def _provider_credentials(
    spec: EvalRunSpec, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Adds the providers' Secret volumes, for the proxy container only; returns the variables
    naming their key files."""
    env = []
    for name, provider in sorted(spec.providers.items()):
        ref = provider.credentials_secret_ref
        if ref is not None:
            items = [{"key": ref.key, "path": "key"}]
            secret = {"secret": {"secretName": ref.name, "items": items}}
            path = f"{PROVIDER_KEYS_DIR}/{name}"
            _read_only_volume(volumes, mounts, f"provider-{name}", path, secret)
            variable = f"EVALKUBE_PROVIDER_{name.upper().replace('-', '_')}_KEY_FILE"
            env.append({"name": variable, "value": f"{path}/key"})
    return env
