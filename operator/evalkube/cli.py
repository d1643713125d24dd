"""``evalkube``: run suites on this machine, inspect samples, and start the cluster parts.

Exit codes: 0 the run finished and printed its scores (invalid samples included);
2 configuration error (bad YAML, spec, dataset, provider or key, grader that does not load;
a run that had started ends ``Failed``); 3 the run could not complete (sandbox or store
failure, ``Failed``); 4 stopped by ``--max-error-rate`` (``Failed``); 130 interrupted
(``Interrupted``; resume with ``--resume RUN_ID``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evalkube import __version__, limits
from evalkube.cli_support import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    DbOption,
    console,
    errors,
    shown_store,
    store_url,
)
from evalkube.cli_support import fail as _fail
from evalkube.cli_support import open_store as _open_store
from evalkube.compare_view import gate_table
from evalkube.engine import ConfigError, Unit, UnitFailed, load_files, resolve_run_spec
from evalkube.engine.guard import RunAborted
from evalkube.grading.gate import gate_message, gate_run
from evalkube.local import LocalEngine, RunSummary
from evalkube.local.preflight import preflight
from evalkube.models import GateStatus
from evalkube.reporting import track
from evalkube.reporting.output import write_run_output
from evalkube.reporting.tables import results_table
from evalkube.sandbox import SandboxError, SandboxUnavailable, resolve_backend
from evalkube.store import StoreError

EXIT_GATE_FAILED = 1
EXIT_ABORTED = 4

app = typer.Typer(
    name="evalkube",
    help="Sandboxed Python graders for LLM evaluations: run suites locally or in Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _OncePerCause(logging.Handler):
    """Shows each distinct failure of the model bridge once, then counts its repeats.

    Graders call models once per sample: a key the provider rejects or a missing endpoint
    would otherwise print one stderr line per sample. The message without its execution id
    is the cause; :meth:`summary` says how many more calls failed that way.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        cause = re.sub(r"\(execution [^,]*, ", "(", text)
        self.counts[cause] = self.counts.get(cause, 0) + 1
        if self.counts[cause] == 1:
            errors.print(f"[yellow]warning:[/] {escape(cause)}", highlight=False, soft_wrap=True)

    def summary(self) -> None:
        for cause, count in self.counts.items():
            if count > 1:
                errors.print(
                    f"[yellow]warning:[/] {count - 1} more model calls failed the same way: "
                    f"{escape(cause)}",
                    highlight=False,
                    soft_wrap=True,
                )


@contextlib.contextmanager
def _bridge_failures_once() -> Iterator[None]:
    """While a local run goes, its bridge's failures are shown once per cause."""
    logger = logging.getLogger("evalkube.proxy")
    handler = _OncePerCause()
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        handler.summary()


def _generates(unit: Unit) -> bool:
    return unit.kind == "shard" and unit.model.split(":", 1)[0] not in ("precomputed", "local")


class _RichProgress:
    """Draws bars per task x model from the engine's unit events: one counting model answers
    as they arrive (generated candidates), one counting graded and recorded samples."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.bars: dict[tuple[str, str, str], Any] = {}
        #: Samples each unit was expected to have, until it says how many it has.
        self.expected: dict[str, int] = {}

    def _bar(self, unit: Unit, stage: str = "") -> Any:
        stage = stage or ("grade" if _generates(unit) else unit.kind)
        key = (unit.task_id, unit.model, stage)
        if key not in self.bars:
            suffix = {"aggregate": " · grade_batch", "shard": ""}.get(stage, f" · {stage}")
            label = f"{unit.task_id} · {unit.model}{suffix}"
            self.bars[key] = self.progress.add_task(label, total=0)
        return self.bars[key]

    def _grow(self, bar: Any, by: int) -> None:
        self.progress.update(bar, total=(self.progress.tasks[bar].total or 0) + by)

    def planned(self, units: Sequence[Unit]) -> None:
        """Size every bar up front (units run in parallel would otherwise grow it)."""
        for unit in units:
            self.expected[unit.unit_id] = rows = unit.stop - unit.start
            if _generates(unit):
                self._grow(self._bar(unit, "generate"), rows)
            self._grow(self._bar(unit), rows)

    def unit_started(self, unit: Unit, total: int) -> None:
        change = total - self.expected.pop(unit.unit_id, 0)
        if _generates(unit):
            self._grow(self._bar(unit, "generate"), change)
        self._grow(self._bar(unit), change)

    def advance(self, unit: Unit, samples: int) -> None:
        self.progress.advance(self._bar(unit), samples)

    def generated(self, unit: Unit, answers: int) -> None:
        self.progress.advance(self._bar(unit, "generate"), answers)


def _results_table(summary: RunSummary) -> Table:
    return results_table(f"{summary.suite} · run {summary.run_id}", summary.results)


@app.command()
def run(
    suite: Annotated[
        Path | None, typer.Argument(help="EvalSuite YAML (may also hold the EvalRun)")
    ] = None,
    run_file: Annotated[Path | None, typer.Argument(metavar="[RUN]", help="EvalRun YAML")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the run's results as JSON")
    ] = None,
    output_samples: Annotated[
        bool, typer.Option("--output-samples", help="Add every sample's view to --output")
    ] = False,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model(s) to run, overriding the run file"),
    ] = None,
    sandbox: Annotated[str, typer.Option(help="auto|gvisor|nsjail|bwrap|process")] = "auto",
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue an interrupted run by id")
    ] = None,
    db: DbOption = None,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="With --resume: take the suite and grader files from disk (fixed since the "
            "run started) instead of the copy saved with the run; the run records the change",
        ),
    ] = False,
    probe: Annotated[
        bool, typer.Option("--probe", help="Before starting, make one real call per provider")
    ] = False,
    max_error_rate: Annotated[
        float,
        typer.Option(
            "--max-error-rate",
            min=0.0,
            max=1.0,
            help="Stop the run (Failed, exit 4) once a task x model has "
            f"{limits.ERROR_RATE_MIN_SAMPLES}+ model calls or samples ended and at least this "
            "share of them failed",
        ),
    ] = limits.MAX_ERROR_RATE_DEFAULT,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Never stop on errors (no --max-error-rate)")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars")] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-j",
            min=1,
            help="Processes grading shard units at once [default: one per core when each "
            "gets 10,000+ samples, else 1]",
            show_default=False,
        ),
    ] = None,
    mlflow: Annotated[
        str | None,
        typer.Option(
            "--mlflow",
            envvar=track.URI_ENV,
            help="Log the finished run to this MLflow tracking server (in the background; a "
            "server that is down is a warning)",
        ),
    ] = None,
    mlflow_experiment: Annotated[
        str | None,
        typer.Option(
            "--mlflow-experiment",
            envvar=track.EXPERIMENT_ENV,
            help="MLflow experiment [default: the run file's, else evalkube/SUITE]",
        ),
    ] = None,
) -> None:
    """Run every task x model of a suite on this machine and print the scores."""
    if (suite is None) == (resume is None):
        _fail("give a SUITE file, or --resume RUN_ID", EXIT_CONFIG)
    if reload and resume is None:
        _fail("--reload goes with --resume RUN_ID (a new run reads the files anyway)", EXIT_CONFIG)
    if output_samples and output is None:
        _fail("--output-samples adds the samples to --output FILE: give --output too", EXIT_CONFIG)
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailable as exc:
        _fail(str(exc), EXIT_CONFIG)
    store = _open_store(db)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=errors,
        disable=quiet or not errors.is_terminal,
        transient=False,
    )
    engine = LocalEngine(
        store,
        backend,
        progress=_RichProgress(progress),
        bridge_factory=_bridge_factory(),
        workers=workers,
        max_error_rate=None if keep_going else max_error_rate,
    )
    try:
        with _bridge_failures_once(), progress:
            if resume is not None:
                summary = engine.resume(resume, reload=reload)
            else:
                assert suite is not None
                loaded, run_resource = load_files(suite, run_file)
                spec = resolve_run_spec(loaded, run_resource, model)
                errors.print(f"sandbox: [bold]{backend.describe()}[/]", highlight=False)
                for skipped, why in backend.passed_over:
                    errors.print(
                        f"[yellow]warning:[/] sandbox {skipped} not used: {escape(why)}",
                        highlight=False,
                    )
                summary = engine.start(loaded, spec, probe=probe)
    except (ConfigError, UnitFailed) as exc:
        _fail(str(exc) + _ended_failed(engine.run_id, reload=True), EXIT_CONFIG)
    except RunAborted as exc:
        _fail(str(exc) + _ended_failed(engine.run_id), EXIT_ABORTED)
    except (SandboxError, StoreError) as exc:
        _fail(f"{exc}; recorded samples are kept" + _ended_failed(engine.run_id), EXIT_RUNTIME)
    except KeyboardInterrupt:
        errors.print(
            "[yellow]interrupted:[/] recorded samples and model answers are kept; continue "
            f"with `evalkube run --resume {engine.run_id or '<run id>'}`",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        store.close()
    for change in summary.reloads:
        errors.print(
            f"suite version changed: {change['from'][:19]} -> {change['to'][:19]} "
            f"(--reload, {change['at']})",
            highlight=False,
        )
    console.print(_results_table(summary))
    console.print(f"sandbox: {summary.sandbox} · {summary.seconds:.2f} s", highlight=False)
    for problem in summary.problems:
        errors.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False)
    gate = _local_gate(db, summary)
    tracking = track.start(
        db, summary.run_id, summary.suite, summary.results, gate, mlflow, mlflow_experiment
    )
    if gate is not None:
        console.print(gate_table(gate))
    if output is not None:
        document = summary.to_json()
        if gate is not None:
            document["gate"] = gate.to_wire()
        write_run_output(output, document, db, samples=output_samples)
    if tracking is not None:
        tracking.finish(summary.run_id)
    if gate is not None and not gate.passed:
        errors.print(f"[red]gate failed:[/] {escape(gate_message(gate))}", highlight=False)
        raise typer.Exit(EXIT_GATE_FAILED)


def _local_gate(db: str | None, summary: RunSummary) -> GateStatus | None:
    """The run's gate (its EvalRun's ``spec.gate``) on a Succeeded local run: a named
    baseline is a run id of the same store, ``lastSucceeded`` the suite's latest one there."""
    if summary.phase != "Succeeded":
        return None
    store = _open_store(db)
    try:
        record = store.get_run(summary.run_id)
        spec = track.run_spec(record.spec) if record is not None else None
        if spec is None or spec.gate is None:
            return None
        baseline = spec.gate.baseline
        return gate_run(
            store,
            spec.gate,
            summary.run_id,
            summary.results,
            suite=summary.suite,
            baseline_id=baseline.run if baseline is not None else None,
        )
    finally:
        store.close()


def _ended_failed(run_id: str | None, *, reload: bool = False) -> str:
    """How to continue a run that was recorded before it failed (nothing when none was)."""
    if run_id is None:
        return ""
    how = f"`evalkube run --resume {run_id}" + (" --reload`" if reload else "`")
    return f"\nrun {run_id} is recorded as Failed; once the cause is fixed, continue it with {how}"


def _bridge_factory() -> Any:
    try:
        from evalkube.proxy.bridge import local_model_access
    except ImportError:
        return None
    return local_model_access


@app.command()
def compare(
    baseline: Annotated[str, typer.Argument(help="Baseline run id (see `evalkube runs`)")],
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id to compare with it")],
    confidence: Annotated[
        float, typer.Option(min=0.5, max=0.999, help="Confidence of the paired interval")
    ] = 0.95,
    flipped: Annotated[
        int, typer.Option(min=0, max=50, help="Changed samples listed per metric")
    ] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    db: DbOption = None,
    api: Annotated[
        str | None,
        typer.Option(
            envvar="EVALKUBE_API",
            help="Compare two EvalRuns (by name) through the operator's API (URL)",
        ),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="With --api")] = "default",
) -> None:
    """Per-metric change of RUN against BASELINE over the samples both graded, with a paired
    bootstrap confidence interval, and the samples whose score changed."""
    from evalkube.compare_view import comparison_table, flipped_table
    from evalkube.grading.compare import compare_runs, compare_scores

    if api is not None:
        from evalkube.reporting.export import ApiError, api_keyed_scores

        token = os.environ.get("EVALKUBE_API_TOKEN")
        try:
            baseline_rows = list(api_keyed_scores(api, namespace, baseline, token))
            deltas = compare_scores(
                baseline_rows,
                api_keyed_scores(api, namespace, run_id, token),
                confidence=confidence,
            )
        except ApiError as exc:
            _fail(str(exc), EXIT_RUNTIME if exc.unreachable else EXIT_CONFIG)
    else:
        store = _open_store(db)
        try:
            for name in (baseline, run_id):
                if store.get_run(name) is None:
                    _fail(f"run {name!r} not found in {shown_store(store_url(db))}", EXIT_CONFIG)
            deltas = compare_runs(store, baseline, run_id, confidence=confidence)
        finally:
            store.close()
    if as_json:
        payload = {"baseline": baseline, "run": run_id, "metrics": [d.to_dict() for d in deltas]}
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
        return
    if not deltas:
        console.print(f"{run_id} and {baseline} share no samples (no common task x model)")
        return
    console.print(comparison_table(baseline, run_id, deltas))
    if flipped and any(d.flipped for d in deltas):
        console.print(flipped_table(deltas, flipped))


@app.command()
def validate(
    suite: Annotated[Path, typer.Argument(help="EvalSuite YAML")],
    run_file: Annotated[Path | None, typer.Argument(metavar="[RUN]")] = None,
    sandbox: Annotated[
        str, typer.Option(help="Where grader imports are tried: auto|gvisor|nsjail|bwrap|process")
    ] = "auto",
    probe: Annotated[
        bool, typer.Option("--probe", help="Also make one real call per provider of the run")
    ] = False,
) -> None:
    """Check a suite (and run) before running it: specs, templates, grader code, every
    dataset row, grader imports (in the sandbox), the run's providers and their keys."""
    from evalkube.engine.runtime import TaskRuntime
    from evalkube.engine.validate import check_programs

    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailable as exc:
        if sandbox != "auto":
            _fail(str(exc), EXIT_CONFIG)
        errors.print(
            "[yellow]warning:[/] grader imports not tried: no isolating sandbox here "
            "(`--sandbox process` tries them without isolation)",
            highlight=False,
        )
        backend = None
    try:
        loaded, run_resource = load_files(suite, run_file)
        for task in loaded.suite.spec.tasks:
            TaskRuntime.build(loaded, task)
        check_programs(loaded)
        spec = run_resource.spec if run_resource is not None else None
        preflight(loaded, spec, backend, probe=probe)
    except (ConfigError, UnitFailed) as exc:
        _fail(str(exc), EXIT_CONFIG)
    console.print(
        f"[green]ok[/]: {loaded.name} ({len(loaded.suite.spec.tasks)} tasks, {loaded.version[:19]})"
    )


@app.command()
def submit(
    suite: Annotated[Path, typer.Argument(help="EvalSuite YAML (may also hold the EvalRun)")],
    run_file: Annotated[Path | None, typer.Argument(metavar="[RUN]", help="EvalRun YAML")] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Upload local datasets and outputs to s3://BUCKET/PREFIX (the run's "
            "spec.storage.s3 store) [default: small JSONL datasets go into ConfigMaps]",
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="[default: the files', else the kubeconfig context's]"
        ),
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context")] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config]")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="EvalRun name [default: the run file's, else SUITE-TIMESTAMP]"),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model(s) to run, overriding the run file"),
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Apply, print the names and exit")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the manifests; upload and apply nothing"),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars")] = False,
) -> None:
    """Run a suite in a Kubernetes cluster: upload its local files, apply the EvalSuite and
    EvalRun, watch the run and print its scores (exit codes as `evalkube run`)."""
    from evalkube.submit.command import submit as submit_command

    submit_command(
        suite,
        run_file,
        store=store,
        namespace=namespace,
        context=context,
        kubeconfig_path=kubeconfig,
        name=name,
        models=model,
        wait=not no_wait,
        dry_run=dry_run,
        quiet=quiet,
    )


import_app = typer.Typer(help="Convert evals from other systems into EvalSuite/EvalRun files.")
app.add_typer(import_app, name="import")


@import_app.command("openai")
def import_openai_command(
    export: Annotated[Path, typer.Argument(help='OpenAI export: {"eval": {...}, "run": {...}}')],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for suite.yaml and run.yaml")
    ] = Path("."),
    name: Annotated[str | None, typer.Option(help="Suite name (default: the eval's)")] = None,
) -> None:
    """Write an OpenAI eval export as suite.yaml + run.yaml (see docs/migrating-from-openai.md)."""
    import yaml

    from evalkube.local.openai_import import import_openai
    from evalkube.sources.files import read_text

    try:
        text = read_text(export, str(export), limits.IMPORT_EXPORT_BYTES)
        document = json.loads(text)
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)
    except ValueError as exc:
        _fail(f"{export}: cannot read the export as JSON ({str(exc)[:200]})", EXIT_CONFIG)
    except RecursionError:
        _fail(f"{export}: the export's JSON nests too deeply", EXIT_CONFIG)
    try:
        imported = import_openai(document, name)
    except ConfigError as exc:
        _fail(f"{export}: {exc}", EXIT_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    for filename, resource in (("suite.yaml", imported.suite), ("run.yaml", imported.run)):
        (out / filename).write_text(
            yaml.safe_dump(resource.to_wire(), sort_keys=False, allow_unicode=True)
        )
    task = imported.suite.spec.tasks[0]
    extra = ""
    if imported.outputs is not None:
        with (out / "outputs.jsonl").open("w", encoding="utf-8") as lines:
            for line in imported.outputs:
                lines.write(json.dumps(line, ensure_ascii=False) + "\n")
        extra = f", {out / 'outputs.jsonl'} (stored samples: no model is called)"
    console.print(
        f"[green]ok[/]: {out / 'suite.yaml'} ({len(task.dataset.rows or [])} items, "
        f"{len(task.criteria)} criteria) and {out / 'run.yaml'}{extra}"
    )


@app.command()
def version() -> None:
    """Print the evalkube version."""
    console.print(__version__)


def _mount_subcommands() -> None:
    from evalkube.controller.crds_cli import crds
    from evalkube.proxy import cli as proxy_cli
    from evalkube.reporting import commands as reporting

    app.command("crds")(crds)
    reporting.register(app)
    proxy_cli.register(app)


_mount_subcommands()


def main() -> None:  # pragma: no cover - console entry
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


@app.command("operator")
def operator_command(
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
    kopf.run(
        standalone=not settings.peering,
        clusterwide=not namespaces,
        namespaces=namespaces,
    )


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


@app.command("unit")
def unit_command(
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
    from evalkube.engine.policy_gate import (
        IPv6Present,
        PolicyNotEnforced,
        refuse_ipv6,
        wait_for_enforced_policy,
    )
    from evalkube.proxy.control import ControlClient
    from evalkube.sandbox.remote import PodSocketBackend
    from evalkube.store.remote import IngestUnreachable, RemoteStore

    token = _ingest_token()
    loaded = _pod_snapshot(snapshot, datasets, egress_proxy, egress_grant_file, pvc_root, ca_bundle)
    if policy_canary:
        # before the grader gets code or samples: its container shares this pod's network
        try:
            waited = wait_for_enforced_policy(policy_canary)
        except PolicyNotEnforced as exc:
            _fail(str(exc), EXIT_RUNTIME)
        console.print(f"NetworkPolicy enforced (waited {waited:.1f} s)", highlight=False)
    if ipv6 == "refuse":
        try:
            refuse_ipv6()
        except IPv6Present as exc:
            _fail(str(exc), EXIT_RUNTIME)
        console.print("no IPv6 route in the pod", highlight=False)
    backend = PodSocketBackend(worker.removeprefix("unix:")) if worker else resolve_backend(sandbox)
    store = RemoteStore(
        ingest_url, loaded.namespace, loaded.name, token, retry_seconds=ingest_retry_seconds
    )
    # the control socket sits in a volume only the proxy and this container mount
    control = ControlClient(bridge_control, grader_endpoint=bridge) if bridge_control else None
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
        _fail(str(exc), EXIT_CONFIG)
    except IngestUnreachable as exc:
        # a runtime failure: the Job's next Pod takes the unit over where this one stopped
        _fail(str(exc), EXIT_RUNTIME)
    finally:
        store.close()
        if control is not None:
            control.close()
    console.print(
        f"unit {unit}: {report.samples} samples recorded, {report.skipped} already recorded, "
        f"{report.restarts} sandbox restarts, {report.seconds:.2f} s",
        highlight=False,
    )


def _ingest_token() -> str:
    """The run's ingest token, as a pod's runner has it (from the run's ingest Secret)."""
    token = os.environ.get("EVALKUBE_INGEST_TOKEN")
    if not token:
        _fail("EVALKUBE_INGEST_TOKEN is not set (the run's ingest Secret)", EXIT_CONFIG)
    return token


def _pod_snapshot(
    path: Path,
    datasets: Path | None,
    egress_proxy: str | None,
    grant_file: Path | None,
    pvc_root: Path | None,
    ca_bundle: Path | None,
) -> Any:
    """The run's snapshot as a pod's runner loads it, its sources reached through the egress
    gateway when one is given."""
    from evalkube.engine.snapshot import load_snapshot
    from evalkube.proxy.egress import EgressGateway

    try:
        loaded = load_snapshot(path, datasets)
        if egress_proxy and grant_file:
            loaded.loaded.access.proxy = EgressGateway(egress_proxy, grant_file).proxy_url
        if pvc_root is not None:
            loaded.loaded.access.pvc_root = pvc_root
        loaded.loaded.access.ca_bundle = ca_bundle
    except (OSError, ValueError, ConfigError) as exc:
        _fail(f"cannot read the snapshot {path}: {exc}", EXIT_CONFIG)
    return loaded


@app.command("prepare")
def prepare_command(
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
    from evalkube.engine.policy_gate import PolicyNotEnforced, wait_for_enforced_policy
    from evalkube.store.remote import RemoteStore

    token = _ingest_token()
    loaded = _pod_snapshot(snapshot, None, egress_proxy, egress_grant_file, pvc_root, ca_bundle)
    if policy_canary:  # the same confinement as a unit's pod, before anything is fetched
        try:
            wait_for_enforced_policy(policy_canary)
        except PolicyNotEnforced as exc:
            _fail(str(exc), EXIT_RUNTIME)
    started = time.perf_counter()
    report = prepare_sources(loaded)
    store = RemoteStore(ingest_url, loaded.namespace, loaded.name, token)
    try:
        store.mark_unit_done(PREPARE_UNIT, report)
    finally:
        store.close()
    if "error" in report:
        console.print(f"[red]error[/]: {escape(report['error'])}", highlight=False)
    else:
        console.print(
            f"pinned {len(report['pins'])} sources in {time.perf_counter() - started:.1f} s",
            highlight=False,
        )
