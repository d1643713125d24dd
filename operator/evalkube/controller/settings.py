"""Operator settings: one pydantic-settings class, every field from an ``EVALKUBE_`` variable.

The Helm chart sets these; each field's docstring is its documentation.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from evalkube import limits


class OperatorSettings(BaseSettings):
    """How the operator runs and what it creates."""

    model_config = SettingsConfigDict(
        env_prefix="EVALKUBE_", use_attribute_docstrings=True, extra="ignore"
    )

    runner_image: str = "ghcr.io/evalkube/evalkube:0.1.0"
    """Image of the work-unit ``runner`` and ``proxy`` containers (this package)."""
    sandbox_image: str = "ghcr.io/evalkube/evalkube-sandbox:0.1.0"
    """Image of the ``grader`` container (``evalkube_sandbox`` + the grader environment)."""
    grader_images: list[str] = Field(default_factory=list)
    """Images a task's ``grader.environment`` may name besides the sandbox image: shell-style
    patterns (JSON list; the chart's ``work.graderImages``), e.g. ``registry.example.com/evals/*``
    (``*`` matches ``/`` too: everything pushed under that path, at any depth).
    The image's own ``python3`` supervises the untrusted grader (its limits, its kill-all), so
    name only images built ``FROM`` the sandbox image by people you trust. Empty: the sandbox
    image only; a suite naming another image is ``Invalid`` and its runs fail."""
    runtime_class: str | None = "gvisor"
    """RuntimeClass of work-unit pods (gVisor); empty to use the node default."""
    shard_size: int = Field(default=limits.SHARD_SIZE_DEFAULT, ge=1)
    """Rows per work unit when the EvalRun does not set ``shardSize``."""
    parallelism: int = Field(default=10, ge=1, le=1000)
    """Work-unit Jobs running at once per EvalRun."""
    store_url: str = "sqlite:////var/lib/evalkube/results.db"
    """Results store: SQLite on a PersistentVolume, or a PostgreSQL URL."""
    ingest_url: str = "http://evalkube.evalkube-system.svc:8080"
    """URL work-unit pods post samples to (the operator's HTTP server, via its Service)."""
    api_token: str | None = None
    """The read token of the samples API (``Authorization: Bearer <token>``; the chart keeps it
    in a Secret). The samples API always needs a token: this one, or the run's own ingest
    token for that run; unset, only run tokens are accepted."""
    listen: str = "0.0.0.0:8080"
    """Address of the ingest server (work-unit pods post samples here, with their run's token)."""
    api_listen: str = "0.0.0.0:8081"
    """Address of the samples API, ``/metrics`` and ``/healthz`` (not reachable from work pods)."""
    namespace: str | None = None
    """Watch only this namespace (default: all namespaces); added to ``namespaces``."""
    namespaces: list[str] = Field(default_factory=list)
    """Watch only these namespaces (JSON list; the chart's ``watchNamespaces``). The operator
    then needs a Role in each and nothing cluster-wide: kopf runs namespace-scoped with its
    cluster scanning (namespaces, CRDs) off."""
    operator_namespace: str = "evalkube-system"
    """Namespace of the operator (egress from work-unit pods is allowed to it)."""
    operator_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "evalkube"}
    )
    """Labels of the operator pods (the NetworkPolicy's ingest egress target)."""
    ingest_port: int = 8080
    """The ingest port: the only port of the operator pods work-unit pods may reach."""
    egress_via_gateway: bool = False
    """Send work-unit pods' model calls through the egress gateway (``evalkube-proxy
    gateway``; the chart turns it on). On: the pods' NetworkPolicy allows nothing but the
    gateway's and the operator's ingest port, with no DNS (the operator passes both as
    ClusterIP URLs), and each run gets an egress grant naming its providers' hosts. Off: the
    policy allows DNS and the provider ports on the internet, which the grader container of
    the pod inherits (``docs/security.md``)."""
    egress_gateway_url: str = "http://evalkube-egress.evalkube-system.svc:3128"
    """The gateway's Service URL; a ``<service>.<namespace>.svc`` host is resolved to the
    Service's ClusterIP, since work-unit pods have no DNS."""
    policy_canary_url: str | None = None
    """With ``egress_via_gateway``: an address every pod may reach but work-unit pods may not
    (the chart: the gateway's metrics port). Each runner waits until it is refused, i.e. until
    the CNI enforces the run's NetworkPolicy, before grader code runs; unset, no check."""
    egress_gateway_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "evalkube-egress"}
    )
    """Labels of the gateway pods (in ``operator_namespace``): the NetworkPolicy's target."""
    egress_grant_key_file: str = "/var/run/secrets/evalkube/egress/key"
    """File with the grant signing keys, one per line: the first signs (the gateway, which
    mounts the same Secret, accepts any), so a key is rotated by prepending the new one."""
    egress_grant_ttl_seconds: int = Field(default=86_400, ge=600)
    """Lifetime of a run's egress grant; the operator mints a fresh one into the run's Secret
    when half of it has passed (a running pod's proxy re-reads the mounted file)."""
    job_backoff_limit: int = Field(default=2, ge=0, le=10)
    """Retries of a failed work unit before it counts as failed."""
    ingest_retry_seconds: float = Field(default=300.0, ge=5.0, le=3600.0)
    """Seconds a unit's runner keeps retrying one call to the ingest API (connection errors,
    5xx, 404) before its Pod fails and the Job retries it; no single attempt outlasts it."""
    job_ttl_seconds: int = Field(default=3600, ge=0)
    """Seconds finished Jobs are kept (``ttlSecondsAfterFinished``)."""
    tmp_size: str = "256Mi"
    """Size of the grader's ``/tmp`` (a memory-backed emptyDir)."""
    grader_memory: str = "1Gi"
    """Memory of the grader's processes, enforced inside the grader container as in a local
    sandbox (``RLIMIT_AS`` per process, and the sum of their resident memory watched by the
    container's supervisor: past it the sample fails "out of memory"). The container's limit
    adds ``limits.SANDBOX_MEMORY_OVERHEAD_BYTES`` for the supervisor and gVisor's own
    accounting, so the pod's cgroup (which gVisor charges for all containers together) is not
    what stops a grader."""
    grader_log_bytes: int = Field(default=1 << 20, ge=0)
    """Bytes of grader output (file descriptors 1 and 2) a work-unit pod copies to its
    container log, over all its workers; the rest is dropped (the runner keeps each worker's
    tail for its crash reports). Bounds what a grader writes to the node's disk."""
    ipv6: Literal["disable", "refuse", "allow"] = "disable"
    """IPv6 in work-unit pods, whose NetworkPolicy CNIs often enforce for IPv4 only while
    gVisor serves link-local IPv6 (``docs/security.md``). ``disable``: the pods carry the
    sysctl ``net.ipv6.conf.all.disable_ipv6=1`` (gVisor and runc apply it; the kubelet must
    allow it: ``allowedUnsafeSysctls``) and the runner refuses to give grader code anything
    while the pod still has an IPv6 route. ``refuse``: no sysctl (the CNI keeps pods
    IPv4-only), the same refusal. ``allow``: neither (a CNI that enforces NetworkPolicy for
    IPv6, link-local included)."""
    grader_cpu: str = "1"
    """CPU limit of the grader container."""
    runner_memory: str = "512Mi"
    """Memory limit of the runner container."""
    proxy_memory: str = "256Mi"
    """Memory limit of the proxy sidecar."""
    proxy_engine: Literal["auto", "native", "python"] = "auto"
    """Model bridge implementation in work-unit pods (``evalkube proxy --engine``): ``auto``
    runs the compiled ``evalkube-proxy`` of the image unless the run uses a ``local:`` model."""
    active_deadline_slack_seconds: int = 300
    """Added to a unit's worst-case grading time for ``activeDeadlineSeconds``."""
    unit_deadline_max_seconds: int = Field(default=limits.UNIT_DEADLINE_MAX_SECONDS, ge=60)
    """Most seconds a work-unit Job may run: its ``activeDeadlineSeconds`` is the unit's worst
    case (rows x timeouts + slack) up to this. A longer worst case gets a ``DeadlineCapped``
    warning event naming ``shardSize`` and ``timeoutSeconds``."""
    reconcile_interval: float = Field(default=60.0, gt=0)
    """Seconds a running EvalRun's daemon waits for an event before a pass of its own. Runs
    advance on their Jobs' events and their units' reports; this only covers a missed event."""
    retry_interval: float = Field(default=2.0, gt=0)
    """Seconds before a run blocked ``Pending`` (its suite or a Service missing) is looked at
    again."""
    schedule_clock_offset_seconds: float = 0.0
    """Added to the clock EvalSchedules are read against; tests move time forward with it
    instead of waiting for the next minute. Leave 0."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations on work-unit pods (JSON object in the environment variable)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector of work-unit pods (for example nodes that have gVisor installed)."""
    mlflow_attempts: int = Field(default=limits.MLFLOW_OPERATOR_ATTEMPTS, ge=1, le=20)
    """Tries of each step of logging a finished run to MLflow (``spec.tracking.mlflow``) while
    the tracking server does not answer, backing off from 0.5 s to 30 s between tries."""
    peering: bool = False
    """Run with kopf peering (several replicas sharing a PostgreSQL store)."""
    peering_name: str = "evalkube"
    """Name of the kopf peering object replicas coordinate through."""

    def watched_namespaces(self) -> list[str]:
        """``namespaces`` plus ``namespace``, without repeats; empty means every namespace."""
        return list(
            dict.fromkeys([*self.namespaces, *([self.namespace] if self.namespace else [])])
        )
