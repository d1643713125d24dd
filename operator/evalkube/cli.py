"""``evalkube``: run suites on this machine, inspect samples, and start the cluster parts.

Exit codes: 0 the run finished and printed its scores (invalid samples included);
2 configuration error (bad YAML, spec, grader that does not load); 3 the run could not
complete (sandbox or store failure); 130 interrupted (resume with ``--resume RUN_ID``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evalkube import __version__
from evalkube.cli_support import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    DbOption,
    console,
    errors,
)
from evalkube.cli_support import fail as _fail
from evalkube.cli_support import open_store as _open_store
from evalkube.engine import (
    ConfigError,
    LocalEngine,
    RunSummary,
    Unit,
    UnitFailed,
    load_files,
    resolve_run_spec,
)
from evalkube.reporting.output import write_run_output
from evalkube.sandbox import SandboxError, SandboxUnavailable, resolve_backend
from evalkube.store import StoreError

app = typer.Typer(
    name="evalkube",
    help="Sandboxed Python graders for LLM evaluations: run suites locally or in Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _RichProgress:
    """Draws one bar per task x model from the engine's unit events."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.bars: dict[tuple[str, str, str], Any] = {}
        #: Samples each unit was expected to have, until it says how many it has.
        self.expected: dict[str, int] = {}

    def _bar(self, unit: Unit) -> Any:
        key = (unit.task_id, unit.model, unit.kind)
        if key not in self.bars:
            label = f"{unit.task_id} · {unit.model}" + (
                " · grade_batch" if unit.kind == "aggregate" else ""
            )
            self.bars[key] = self.progress.add_task(label, total=0)
        return self.bars[key]

    def planned(self, units: Sequence[Unit]) -> None:
        """Size every bar up front (units run in parallel would otherwise grow it)."""
        for unit in units:
            self.expected[unit.unit_id] = rows = unit.stop - unit.start
            bar = self._bar(unit)
            self.progress.update(bar, total=(self.progress.tasks[bar].total or 0) + rows)

    def unit_started(self, unit: Unit, total: int) -> None:
        bar = self._bar(unit)
        current = self.progress.tasks[bar].total or 0
        self.progress.update(bar, total=current + total - self.expected.pop(unit.unit_id, 0))

    def advance(self, unit: Unit, samples: int) -> None:
        self.progress.advance(self._bar(unit), samples)


def _results_table(summary: RunSummary) -> Table:
    table = Table(title=f"{summary.suite} · run {summary.run_id}", title_justify="left")
    table.add_column("task", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("metrics", overflow="fold")
    for column in ("samples", "valid", "invalid", "errored"):
        table.add_column(column, justify="right", min_width=len(column), no_wrap=True)
    for result in summary.results:
        metrics = (
            "\n".join(f"{escape(name)} = {value:.4f}" for name, value in result.metrics.items())
            or "-"
        )
        if result.error:
            metrics += f"\n[red]batch failed: {escape(result.error)}[/]"
        counts = result.counts
        table.add_row(
            result.task,
            escape(result.model),
            metrics,
            str(counts.samples),
            str(counts.valid),
            f"[yellow]{counts.invalid}[/]" if counts.invalid else "0",
            f"[red]{counts.errored}[/]" if counts.errored else "0",
        )
    return table


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
) -> None:
    """Run every task x model of a suite on this machine and print the scores."""
    if (suite is None) == (resume is None):
        _fail("give a SUITE file, or --resume RUN_ID", EXIT_CONFIG)
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
    )
    run_id = resume
    try:
        with progress:
            if resume is not None:
                summary = engine.resume(resume)
            else:
                assert suite is not None
                loaded, run_resource = load_files(suite, run_file)
                spec = resolve_run_spec(loaded, run_resource, model)
                errors.print(f"sandbox: [bold]{backend.describe()}[/]", highlight=False)
                summary = engine.start(loaded, spec)
    except (ConfigError, UnitFailed) as exc:
        _fail(str(exc), EXIT_CONFIG)
    except (SandboxError, StoreError) as exc:
        _fail(f"{exc}; recorded samples are kept, resume with --resume", EXIT_RUNTIME)
    except KeyboardInterrupt:
        errors.print(
            "[yellow]interrupted:[/] recorded samples are kept; continue with "
            "`evalkube run --resume <run id>` (see `evalkube runs`)"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        store.close()
    del run_id
    console.print(_results_table(summary))
    console.print(f"sandbox: {summary.sandbox} · {summary.seconds:.2f} s", highlight=False)
    for problem in summary.problems:
        errors.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False)
    if output is not None:
        write_run_output(output, summary.to_json(), db, samples=output_samples)


def _bridge_factory() -> Any:
    try:
        from evalkube.proxy.bridge import local_model_access
    except ImportError:
        return None
    return local_model_access


@app.command()
def validate(
    suite: Annotated[Path, typer.Argument(help="EvalSuite YAML")],
    run_file: Annotated[Path | None, typer.Argument(metavar="[RUN]")] = None,
) -> None:
    """Check a suite (and run) without running anything: specs, templates, grader code."""
    from evalkube.engine.runtime import TaskRuntime
    from evalkube.engine.validate import check_programs

    try:
        loaded, _run = load_files(suite, run_file)
        for task in loaded.suite.spec.tasks:
            TaskRuntime.build(loaded, task)
        check_programs(loaded)
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)
    console.print(
        f"[green]ok[/]: {loaded.name} ({len(loaded.suite.spec.tasks)} tasks, {loaded.version[:19]})"
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
    app.add_typer(proxy_cli.app, name="proxy")


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
    from evalkube.controller.settings import OperatorSettings

    settings = OperatorSettings()
    namespaces = list(namespace or ([settings.namespace] if settings.namespace else []))
    kopf.run(
        standalone=not settings.peering,
        clusterwide=not namespaces,
        namespaces=namespaces,
    )


@app.command("unit")
def unit_command(
    snapshot: Annotated[Path, typer.Option(help="The run's snapshot.json (ConfigMap volume)")],
    unit: Annotated[str, typer.Option(help="Unit id to run")],
    ingest_url: Annotated[str, typer.Option(help="The operator's ingest API")],
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
    policy_canary: Annotated[
        str | None,
        typer.Option(help="URL the pod's NetworkPolicy refuses: wait until it is refused"),
    ] = None,
) -> None:
    """Run one work unit of an EvalRun (the runner container of a work-unit pod)."""
    from evalkube.engine.pod import load_snapshot, run_pod_unit
    from evalkube.engine.policy_gate import PolicyNotEnforced, wait_for_enforced_policy
    from evalkube.proxy.control import ControlClient
    from evalkube.sandbox.remote import PodSocketBackend
    from evalkube.store.remote import RemoteStore

    token = os.environ.get("EVALKUBE_INGEST_TOKEN")
    if not token:
        _fail("EVALKUBE_INGEST_TOKEN is not set (the run's ingest Secret)", EXIT_CONFIG)
    try:
        loaded = load_snapshot(snapshot, datasets)
    except (OSError, ValueError, ConfigError) as exc:
        _fail(f"cannot read the snapshot {snapshot}: {exc}", EXIT_CONFIG)
    if policy_canary:
        # before the grader gets code or samples: its container shares this pod's network
        try:
            waited = wait_for_enforced_policy(policy_canary)
        except PolicyNotEnforced as exc:
            _fail(str(exc), EXIT_RUNTIME)
        console.print(f"NetworkPolicy enforced (waited {waited:.1f} s)", highlight=False)
    backend = PodSocketBackend(worker.removeprefix("unix:")) if worker else resolve_backend(sandbox)
    store = RemoteStore(ingest_url, loaded.namespace, loaded.name, token)
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
        )
    except (ConfigError, UnitFailed) as exc:
        _fail(str(exc), EXIT_CONFIG)
    finally:
        store.close()
        if control is not None:
            control.close()
    console.print(
        f"unit {unit}: {report.samples} samples recorded, {report.skipped} already recorded, "
        f"{report.restarts} sandbox restarts, {report.seconds:.2f} s",
        highlight=False,
    )
