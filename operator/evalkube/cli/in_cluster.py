"""The commands the cluster's pods start: ``evalkube operator`` (the operator's), ``unit``
(a work-unit pod's runner) and ``prepare`` (the run's prepare pod)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from evalkube import limits
from evalkube.engine import ConfigError, UnitFailed
from evalkube.reporting.console import EXIT_CONFIG, EXIT_RUNTIME, console, fail
from evalkube.sandbox import resolve_backend


def operator(
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-n", help="Watch only these namespaces")
    ] = None,
) -> None:
    """Run the Kubernetes operator (settings from EVALKUBE_* variables; see docs/operator.md)."""
    import kopf

    import evalkube.controller.handlers  # noqa: F401 - registers the handlers
    from evalkube.controller import tracking
    from evalkube.controller.settings import OperatorSettings
    from evalkube.reporting.report import render_report

    tracking.use_report(render_report)  # report.html with runs logged to MLflow

    settings = OperatorSettings()
    namespaces = list(namespace or settings.watched_namespaces())
    kopf.run(standalone=not settings.peering, clusterwide=not namespaces, namespaces=namespaces)


#: Options the pod commands (``unit``, ``prepare``) share, as their Jobs pass them.
SnapshotFile = Annotated[Path, typer.Option(help="The run's snapshot.json (ConfigMap volume)")]
IngestURL = Annotated[str, typer.Option(help="The operator's ingest API")]
PolicyCanary = Annotated[
    str | None, typer.Option(help="URL the pod's NetworkPolicy refuses: wait until it is refused")
]
EgressProxy = Annotated[
    str | None, typer.Option(help="The egress gateway for s3:// and https:// sources")
]
EgressGrantFile = Annotated[
    Path | None, typer.Option(help="The run's egress grant (with --egress-proxy)")
]
PvcRoot = Annotated[Path | None, typer.Option(help="Where pvc:// sources' claims are mounted")]
CaBundle = Annotated[
    Path | None, typer.Option(help="PEM certificates trusted for https:// sources")
]


def unit(
    snapshot: SnapshotFile,
    unit: Annotated[str, typer.Option(help="Unit id to run")],
    ingest_url: IngestURL,
    worker: Annotated[
        str | None, typer.Option(help="unix:PATH of the grader container's socket")
    ] = None,
    sandbox: Annotated[str, typer.Option(help="Local sandbox when --worker is not given")] = "auto",
    bridge: Annotated[str | None, typer.Option(help="Model bridge for ctx (unix:PATH)")] = None,
    bridge_control: Annotated[
        str | None, typer.Option(help="Model bridge control endpoint (unix:PATH)")
    ] = None,
    datasets: Annotated[
        Path | None, typer.Option(help="Where dataset ConfigMaps are mounted")
    ] = None,
    policy_canary: PolicyCanary = None,
    ipv6: Annotated[
        str,
        typer.Option(help="refuse: run no grader code while the pod has an IPv6 route; allow"),
    ] = "allow",
    task: Annotated[
        str | None, typer.Option(help="The unit's task (whose source pins are fetched)")
    ] = None,
    egress_proxy: EgressProxy = None,
    egress_grant_file: EgressGrantFile = None,
    pvc_root: PvcRoot = None,
    ca_bundle: CaBundle = None,
    ingest_retry_seconds: Annotated[
        float,
        typer.Option(help="Seconds one ingest call is retried before the Pod fails", min=1.0),
    ] = 300.0,
) -> None:
    """Run one work unit of an EvalRun (the runner container of a work-unit pod)."""
    from evalkube.engine.pod import run_pod_unit
    from evalkube.engine.policy_gate import IPv6Present, refuse_ipv6
    from evalkube.proxy.control import ControlClient
    from evalkube.sandbox.remote import PodSocketBackend
    from evalkube.store.remote import IngestUnreachable, RemoteStore

    token, loaded, waited = _pod_start(
        snapshot, datasets, policy_canary, egress_proxy, egress_grant_file, pvc_root, ca_bundle
    )
    if waited is not None:
        console.print(f"NetworkPolicy enforced (waited {waited:.1f} s)", highlight=False)
    if ipv6 == "refuse":
        try:
            refuse_ipv6()
        except IPv6Present as exc:
            fail(str(exc), EXIT_RUNTIME)
        console.print("no IPv6 route in the pod", highlight=False)
    backend = PodSocketBackend(worker.removeprefix("unix:")) if worker else resolve_backend(sandbox)
    store = RemoteStore(
        ingest_url, loaded.namespace, loaded.name, token, retry_seconds=ingest_retry_seconds
    )
    # the control socket sits in a volume only the proxy and this container mount
    control = ControlClient(bridge_control, grader_endpoint=bridge) if bridge_control else None
    # the container's PID 1 ignores a SIGTERM it has no handler for: an evicted or deleted
    # Pod would grade on through its grace period, then be SIGKILLed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = run_pod_unit(
            loaded,
            unit,
            store=store,
            backend=backend,
            bridge=control,
            bridge_control=bridge_control,
            task_id=task,
        )
    except (ConfigError, UnitFailed) as exc:
        # the run's condition names the cause (another try would fail the same way);
        # run_pod_unit has reported a UnitFailed itself
        if not isinstance(exc, UnitFailed):
            with contextlib.suppress(Exception):
                store.retry_seconds = 30
                store.mark_unit_failed(unit, str(exc)[: limits.ERROR_MESSAGE_CHARS])
        fail(str(exc), EXIT_CONFIG)
    except IngestUnreachable as exc:
        # a runtime failure: the Job's next Pod takes the unit over where this one stopped
        fail(str(exc), EXIT_RUNTIME)
    except KeyboardInterrupt:
        # the answers that arrived are kept (run_pod_unit); the next Pod skips what is stored
        fail(f"unit {unit}: stopped by a signal (the Pod evicted or deleted)", EXIT_RUNTIME)
    finally:
        store.close()
        if control is not None:
            control.close()
    console.print(
        f"unit {unit}: {report.samples} samples recorded, {report.skipped} already recorded, "
        f"{report.restarts} sandbox restarts, {report.seconds:.2f} s",
        highlight=False,
    )


def _pod_start(
    path: Path,
    datasets: Path | None,
    policy_canary: str | None,
    egress_proxy: str | None,
    grant_file: Path | None,
    pvc_root: Path | None,
    ca_bundle: Path | None,
) -> tuple[str, Any, float | None]:
    """What a pod command starts from: the run's ingest token (from its ingest Secret), its
    snapshot (sources reached through the egress gateway when one is given) and, with a
    canary, the seconds waited until the pod's NetworkPolicy was enforced: before anything is
    fetched, or the grader (whose container shares the pod's network) gets code or samples."""
    from evalkube.engine.policy_gate import PolicyNotEnforced, wait_for_enforced_policy
    from evalkube.engine.snapshot import load_snapshot
    from evalkube.proxy.egress import EgressGateway

    token = os.environ.get("EVALKUBE_INGEST_TOKEN")
    if not token:
        fail("EVALKUBE_INGEST_TOKEN is not set (the run's ingest Secret)", EXIT_CONFIG)
    try:
        loaded = load_snapshot(path, datasets)
        if egress_proxy and grant_file:
            loaded.loaded.access.proxy = EgressGateway(egress_proxy, grant_file).proxy_url
        if pvc_root is not None:
            loaded.loaded.access.pvc_root = pvc_root
        loaded.loaded.access.ca_bundle = ca_bundle
    except (OSError, ValueError, ConfigError) as exc:
        fail(f"cannot read the snapshot {path}: {exc}", EXIT_CONFIG)
    try:
        waited = wait_for_enforced_policy(policy_canary) if policy_canary else None
    except PolicyNotEnforced as exc:
        fail(str(exc), EXIT_RUNTIME)
    return token, loaded, waited


def prepare(
    snapshot: SnapshotFile,
    ingest_url: IngestURL,
    policy_canary: PolicyCanary = None,
    egress_proxy: EgressProxy = None,
    egress_grant_file: EgressGrantFile = None,
    pvc_root: PvcRoot = None,
    ca_bundle: CaBundle = None,
) -> None:
    """Pin an EvalRun's uri sources and report them (the run's prepare pod)."""
    from evalkube.engine.pod import PREPARE_UNIT, prepare_sources
    from evalkube.store.remote import RemoteStore

    token, loaded, _ = _pod_start(
        snapshot, None, policy_canary, egress_proxy, egress_grant_file, pvc_root, ca_bundle
    )
    started = time.perf_counter()
    report = prepare_sources(loaded)
    with contextlib.closing(RemoteStore(ingest_url, loaded.namespace, loaded.name, token)) as store:
        store.mark_unit_done(PREPARE_UNIT, report)
    if "error" in report:
        console.print(f"[red]error[/]: {escape(report['error'])}", highlight=False)
    else:
        console.print(
            f"pinned {len(report['pins'])} sources in {time.perf_counter() - started:.1f} s",
            highlight=False,
        )
