"""``evalkube submit SUITE [RUN]``: upload, apply, watch, print the scores, exit as ``run`` does.

Exit codes: 0 the run Succeeded (and its gate passed, if it has one; ``--no-wait`` and
``--dry-run``: the manifests were applied or printed); 1 the gate failed; 2 a configuration
problem, found before anything was applied (files, a refusal naming the field, an EvalRun of
that name already there, a manifest the API server refuses); 3 the run ended ``Failed`` (or
was deleted), or the object store or the cluster could not be reached; 130 interrupted (the
run goes on in the cluster: nothing is deleted).
"""

from __future__ import annotations

import functools
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape
from rich.progress import DownloadColumn, MofNCompleteColumn, TextColumn, TransferSpeedColumn

from evalkube.controller.names import LABEL_MANAGED_BY
from evalkube.engine.loading import load_files
from evalkube.grading.gate import gate_message
from evalkube.models import ConfigError, EvalRunSpec, GateStatus, TaskModelResult
from evalkube.reporting.compare_tables import gate_table
from evalkube.reporting.console import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    console,
    errors,
    fail,
    progress_bars,
)
from evalkube.reporting.tables import results_table
from evalkube.submit.cluster import Cluster, ClusterUnreachable, Refused, kubeconfig
from evalkube.submit.objects import ObjectStore, StoreUnreachable
from evalkube.submit.plan import FIELD_MANAGER, Plan, Store, build_plan, namespace_of

EXIT_GATE_FAILED = 1
FINISHED = ("Succeeded", "Failed")


def submit(
    suite_file: Path,
    run_file: Path | None,
    *,
    store: str | None = None,
    namespace: str | None = None,
    context: str | None = None,
    kubeconfig_path: str | None = None,
    name: str | None = None,
    models: list[str] | None = None,
    wait: bool = True,
    dry_run: bool = False,
    quiet: bool = False,
) -> None:
    """The command (``typer.Exit`` with its exit code unless the run succeeded)."""
    try:
        loaded, run = load_files(suite_file, run_file, versioned=False)
        target = Store.parse(store) if store else None
        try:
            config = kubeconfig(kubeconfig_path, context)
        except ConfigError:
            if not dry_run:
                raise
            config = None  # a dry run names the namespace it would use, needing no cluster
        default_namespace = str(config.namespace) if config is not None else "default"
        plan = build_plan(
            loaded,
            run,
            namespace=namespace_of(loaded, run, namespace, default_namespace),
            now=datetime.now(UTC),
            store=target,
            run_name=name,
            models=models,
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    spec = EvalRunSpec.model_validate(plan.run["spec"])
    objects = ObjectStore(spec.storage.s3 if spec.storage else None)
    for warning in plan.warnings + _endpoint_warnings(plan, spec):
        errors.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    for provider, variable in plan.secret_sources.items():
        errors.print(
            f"the API key of provider {escape(provider)} is read from ${escape(variable)} into "
            f"Secret {plan.namespace}/{escape(plan.secret_name)}, for calls to "
            f"{escape(spec.providers[provider].base_url)} only",
            highlight=False,
            soft_wrap=True,
        )
    if dry_run:
        for upload in plan.uploads:
            errors.print(
                f"would upload {escape(upload.file.named)} ({upload.file.size:,} bytes) to "
                f"{escape(upload.uri)} at {escape(objects.endpoint)}",
                highlight=False,
                soft_wrap=True,
            )
        text = yaml.dump_all(plan.shown(), Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        console.file.write(text)
        console.file.flush()
        return
    assert config is not None
    cluster = Cluster(config)
    try:
        _apply(plan, cluster, objects, quiet=quiet)
        if not wait:
            console.print(_keep_watching(plan), highlight=False, soft_wrap=True)
            return
        final = _watch(plan, cluster, quiet=quiet)
    finally:
        cluster.close()
    _report(plan, final)


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (grader code, JSONL) as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _endpoint_warnings(plan: Plan, spec: EvalRunSpec) -> list[str]:
    """An upload to ``AWS_ENDPOINT_URL`` for a run whose pods would read AWS itself."""
    s3 = spec.storage.s3 if spec.storage else None
    local = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if plan.uploads and local and (s3 is None or s3.endpoint_url is None):
        return [
            f"uploading to {local} (AWS_ENDPOINT_URL), but the run's spec.storage.s3.endpointURL "
            "is unset, so its pods read AWS S3: set it in the run file"
        ]
    return []


def _apply(plan: Plan, cluster: Cluster, objects: ObjectStore, *, quiet: bool) -> None:
    """Check everything with the API server (a dry run), upload, then apply; nothing is
    applied when anything before fails."""
    where = f"{plan.namespace}/{plan.run_name}"
    try:
        existing = cluster.run(plan.namespace, plan.run_name)
        if existing is not None:
            phase = (existing.get("status") or {}).get("phase") or "no status yet"
            fail(
                f"EvalRun {where} exists already ({phase}); an EvalRun runs once: give --name, "
                f"or delete it first (kubectl delete evr {plan.run_name} -n {plan.namespace}); "
                "nothing was applied",
                EXIT_CONFIG,
            )
        _check_keys_secret(plan, cluster)
        cluster.apply(plan.manifests, dry_run=True)
    except ConfigError as exc:
        fail(f"{exc}; nothing was applied", EXIT_CONFIG)
    except ClusterUnreachable as exc:
        fail(f"{exc}; nothing was applied", EXIT_RUNTIME)
    try:
        _upload(plan, objects, quiet=quiet)
    except ConfigError as exc:
        fail(f"{exc}; nothing was applied", EXIT_CONFIG)
    except StoreUnreachable as exc:
        fail(f"{exc}; nothing was applied", EXIT_RUNTIME)
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted:[/] nothing was applied", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    try:
        cluster.apply(plan.manifests)
        _own_keys_secret(plan, cluster)
    except ConfigError as exc:
        fail(str(exc) + _drop_keys_secret(plan, cluster), EXIT_CONFIG)
    except ClusterUnreachable as exc:
        fail(str(exc) + _drop_keys_secret(plan, cluster), EXIT_RUNTIME)
    except KeyboardInterrupt:
        message = "[yellow]interrupted[/] while applying" + escape(_drop_keys_secret(plan, cluster))
        errors.print(message, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    applied = ", ".join(f"{m['kind']} {m['metadata']['name']}" for m in plan.manifests)
    console.print(f"applied {escape(applied)} in namespace {plan.namespace}", highlight=False)


def _check_keys_secret(plan: Plan, cluster: Cluster) -> None:
    """Refuse to touch a Secret of the keys' name that this command did not make, or that a
    run still owns: submitting must never overwrite, nor hand to a run's garbage collection,
    a Secret someone else keeps there."""
    if plan.secret is None:
        return
    name = plan.secret_name
    meta = cluster.secret_metadata(plan.namespace, name)
    if meta is None:
        return
    labels = meta.get("labels") or {}
    owners = [f"{o.get('kind')} {o.get('name')}" for o in meta.get("ownerReferences") or []]
    if labels.get(LABEL_MANAGED_BY) != FIELD_MANAGER:
        raise ConfigError(
            f"Secret {plan.namespace}/{name} exists already and evalkube submit did not make it; "
            "the run's provider keys would replace its data: give --name, or delete it first"
        )
    if owners:
        raise ConfigError(
            f"Secret {plan.namespace}/{name} still belongs to {', '.join(owners)} (being "
            "deleted?): wait until it is gone, or give --name"
        )


def _own_keys_secret(plan: Plan, cluster: Cluster) -> None:
    """Give the keys' Secret the applied EvalRun as its owner (deleting the run deletes it)."""
    if plan.secret is None:
        return
    applied = cluster.run(plan.namespace, plan.run_name) or {}
    uid = (applied.get("metadata") or {}).get("uid")
    if not uid:
        raise ClusterUnreachable(
            f"EvalRun {plan.namespace}/{plan.run_name} was applied but could not be read back "
            "to own its provider keys' Secret"
        )
    owned = plan.owned_secret(uid)
    assert owned is not None
    cluster.apply([owned])


def _drop_keys_secret(plan: Plan, cluster: Cluster) -> str:
    """After a failed apply: delete the keys' Secret this command made (no key is left in
    the cluster without a run to own it); what became of it, for the message."""
    if plan.secret is None:
        return ""
    name = plan.secret_name
    where = f"{plan.namespace}/{name}"
    remains = (
        f"; the provider keys' Secret {where} may remain: "
        f"kubectl delete secret {name} -n {plan.namespace}"
    )
    try:
        cluster.delete_secret(plan.namespace, name)
    except Refused as exc:
        return "" if exc.code == 404 else remains
    except (ClusterUnreachable, ConfigError):
        return remains
    return f"; the provider keys' Secret {where} was deleted again"


def _upload(plan: Plan, objects: ObjectStore, *, quiet: bool) -> None:
    """Each file the store does not hold yet, streamed with a progress bar of its bytes."""
    if not plan.uploads:
        return
    with progress_bars(quiet, DownloadColumn(), TransferSpeedColumn()) as progress:
        for upload in plan.uploads:
            label = escape(upload.file.named)
            if objects.has(upload):
                errors.print(
                    f"{label}: already in the store ({escape(upload.uri)})",
                    highlight=False,
                    soft_wrap=True,
                )
                continue
            bar = progress.add_task(f"upload {label}", total=upload.file.size)
            started = time.perf_counter()
            objects.put(upload, functools.partial(progress.advance, bar))
            progress.update(bar, completed=upload.file.size)
            seconds = time.perf_counter() - started
            rate = upload.file.size / seconds / 1e6 if seconds > 0 else 0.0
            errors.print(
                f"uploaded {label} to {escape(upload.uri)} ({upload.file.size:,} bytes in "
                f"{seconds:.1f} s, {rate:.1f} MB/s)",
                highlight=False,
                soft_wrap=True,
            )


def _keep_watching(plan: Plan) -> str:
    return f"watch it with: kubectl get evr {plan.run_name} -n {plan.namespace} -w"


def describe(status: dict[str, Any]) -> tuple[str, int, int]:
    """``(state, units finished, units total)`` of a run's status, for its progress line:
    the phase, then the units by state, or why it waits (the Ready condition's reason)."""
    phase = status.get("phase") or "Pending"
    units = status.get("units") or {}
    total = int(units.get("total") or 0)
    finished = int(units.get("succeeded") or 0) + int(units.get("failed") or 0)
    parts = [
        f"{units[state]} {state}"
        for state in ("running", "queued", "pending", "failed")
        if units.get(state)
    ]
    if phase not in FINISHED:
        ready = _condition(status, "Ready")
        if ready.get("status") != "True" and ready.get("reason"):
            parts.append(str(ready["reason"]))
    return (f"{phase} · {', '.join(parts)}" if parts else phase), finished, total


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _watch(plan: Plan, cluster: Cluster, *, quiet: bool) -> dict[str, Any]:
    """The run once it finished, its progress drawn from each change of its status."""
    progress = progress_bars(quiet, MofNCompleteColumn(), TextColumn("units"))
    bar = progress.add_task(f"EvalRun {plan.run_name}", total=None)
    shown = ""
    try:
        with progress:
            for obj in cluster.watch_run(plan.namespace, plan.run_name):
                if obj is None:
                    break
                status = obj.get("status") or {}
                state, done, total = describe(status)
                progress.update(
                    bar,
                    description=f"EvalRun {escape(plan.run_name)} · {escape(state)}",
                    completed=done,
                    total=total or None,
                )
                if progress.disable and not quiet and state != shown:
                    errors.print(f"EvalRun {plan.run_name}: {escape(state)}", highlight=False)
                shown = state
                if status.get("phase") in FINISHED:
                    return obj
    except KeyboardInterrupt:
        errors.print(
            f"[yellow]stopped watching:[/] EvalRun {plan.namespace}/{plan.run_name} goes on in "
            f"the cluster; {_keep_watching(plan)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except ClusterUnreachable as exc:
        fail(f"{exc}; the run goes on in the cluster: {_keep_watching(plan)}", EXIT_RUNTIME)
    fail(f"EvalRun {plan.namespace}/{plan.run_name} was deleted while it ran", EXIT_RUNTIME)


def _report(plan: Plan, final: dict[str, Any]) -> None:
    """The scores table, the phase and time, the failure or the gate; the exit code."""
    status = final.get("status") or {}
    results = in_suite_order(
        plan, [TaskModelResult.model_validate(r) for r in status.get("results") or []]
    )
    title = f"{plan.suite_name} · EvalRun {plan.namespace}/{plan.run_name}"
    console.print(results_table(title, results))
    console.print(f"{status.get('phase')} · {_seconds(status)}", highlight=False)
    if status.get("phase") != "Succeeded":
        succeeded = _condition(status, "Succeeded")
        why = f"{succeeded.get('reason', 'Failed')}: {succeeded.get('message', '')}".rstrip(": ")
        fail(f"EvalRun {plan.namespace}/{plan.run_name} failed: {why}", EXIT_RUNTIME)
    if status.get("gate"):
        gate = GateStatus.model_validate(status["gate"])
        console.print(gate_table(gate))
        if not gate.passed:
            errors.print(f"[red]gate failed:[/] {escape(gate_message(gate))}", highlight=False)
            raise typer.Exit(EXIT_GATE_FAILED)


def in_suite_order(plan: Plan, results: list[TaskModelResult]) -> list[TaskModelResult]:
    """``results`` in the order ``evalkube run`` prints them: the suite's tasks, then the
    run's models (the operator's status orders them by name)."""
    tasks = [t["id"] for t in plan.suite["spec"]["tasks"]]
    models = list(plan.run["spec"].get("models") or [])

    def key(result: TaskModelResult) -> tuple[int, int, str, str]:
        task = tasks.index(result.task) if result.task in tasks else len(tasks)
        model = models.index(result.model) if result.model in models else len(models)
        return task, model, result.task, result.model

    return sorted(results, key=key)


def _seconds(status: dict[str, Any]) -> str:
    try:
        started = datetime.fromisoformat(status["startedAt"])
        completed = datetime.fromisoformat(status["completedAt"])
    except (KeyError, TypeError, ValueError):
        return "-"
    return f"{(completed - started).total_seconds():.0f} s"
