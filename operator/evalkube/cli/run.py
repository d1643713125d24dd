"""Running a suite: ``evalkube run`` on this machine, ``evalkube validate`` before it, and
``evalkube submit`` to a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import MofNCompleteColumn

from evalkube import limits
from evalkube.cli.run_output import RichProgress, bridge_failures_once, run_table
from evalkube.engine import ConfigError, UnitFailed, load_files, resolve_run_spec
from evalkube.engine.guard import RunAborted
from evalkube.grading.gate import gate_message, gate_run
from evalkube.local import LocalEngine, RunSummary
from evalkube.local.preflight import preflight
from evalkube.models import GateStatus
from evalkube.proxy.bridge import local_model_access
from evalkube.reporting import track
from evalkube.reporting.compare_tables import gate_table
from evalkube.reporting.console import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    DbOption,
    console,
    errors,
    fail,
    open_store,
    progress_bars,
)
from evalkube.reporting.output import write_run_output
from evalkube.sandbox import SandboxError, SandboxUnavailable, resolve_backend
from evalkube.store import StoreError

EXIT_GATE_FAILED = 1
EXIT_ABORTED = 4

#: Arguments and options ``run`` and ``submit`` share.
RunFile = Annotated[Path | None, typer.Argument(metavar="[RUN]", help="EvalRun YAML")]
Models = Annotated[
    list[str] | None, typer.Option("--model", "-m", help="Model(s) to run, overriding the run file")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars")]


def run(
    suite: Annotated[
        Path | None, typer.Argument(help="EvalSuite YAML (may also hold the EvalRun)")
    ] = None,
    run_file: RunFile = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the run's results as JSON")
    ] = None,
    output_samples: Annotated[
        bool, typer.Option("--output-samples", help="Add every sample's view to --output")
    ] = False,
    model: Models = None,
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
    quiet: Quiet = False,
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
    mlflow_experiment: track.MlflowExperiment = None,
) -> None:
    """Run every task x model of a suite on this machine and print the scores."""
    if (suite is None) == (resume is None):
        fail("give a SUITE file, or --resume RUN_ID", EXIT_CONFIG)
    if reload and resume is None:
        fail("--reload goes with --resume RUN_ID (a new run reads the files anyway)", EXIT_CONFIG)
    if output_samples and output is None:
        fail("--output-samples adds the samples to --output FILE: give --output too", EXIT_CONFIG)
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailable as exc:
        fail(str(exc), EXIT_CONFIG)
    store = open_store(db)
    progress = progress_bars(quiet, MofNCompleteColumn())
    engine = LocalEngine(
        store,
        backend,
        progress=RichProgress(progress),
        bridge_factory=local_model_access,
        workers=workers,
        max_error_rate=None if keep_going else max_error_rate,
    )
    try:
        with bridge_failures_once(), progress:
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
        fail(str(exc) + _ended_failed(engine.run_id, reload=True), EXIT_CONFIG)
    except RunAborted as exc:
        fail(str(exc) + _ended_failed(engine.run_id), EXIT_ABORTED)
    except (SandboxError, StoreError) as exc:
        fail(f"{exc}; recorded samples are kept" + _ended_failed(engine.run_id), EXIT_RUNTIME)
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
    console.print(run_table(summary))
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
    with open_store(db) as store:
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


def _ended_failed(run_id: str | None, *, reload: bool = False) -> str:
    """How to continue a run that was recorded before it failed (nothing when none was)."""
    if run_id is None:
        return ""
    how = f"`evalkube run --resume {run_id}" + (" --reload`" if reload else "`")
    return f"\nrun {run_id} is recorded as Failed; once the cause is fixed, continue it with {how}"


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
            fail(str(exc), EXIT_CONFIG)
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
        fail(str(exc), EXIT_CONFIG)
    console.print(
        f"[green]ok[/]: {loaded.name} ({len(loaded.suite.spec.tasks)} tasks, {loaded.version[:19]})"
    )


def submit(
    suite: Annotated[Path, typer.Argument(help="EvalSuite YAML (may also hold the EvalRun)")],
    run_file: RunFile = None,
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
    model: Models = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Apply, print the names and exit")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the manifests; upload and apply nothing"),
    ] = False,
    quiet: Quiet = False,
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
