"""``evalkube``: run suites on this machine, inspect samples, and start the cluster parts.

Exit codes: 0 the run finished and printed its scores (invalid samples included);
2 configuration error (bad YAML, spec, grader that does not load); 3 the run could not
complete (sandbox or store failure); 130 interrupted (resume with ``--resume RUN_ID``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evalkube import __version__
from evalkube.engine import (
    ConfigError,
    LocalEngine,
    RunSummary,
    Unit,
    UnitFailed,
    load_files,
    resolve_run_spec,
)
from evalkube.sandbox import SandboxError, SandboxUnavailable, resolve_backend
from evalkube.store import ResultStore, StoreError
from evalkube.store.views import STATUS_FILTERS, sample_view

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130
DEFAULT_DB = ".evalkube/results.db"

app = typer.Typer(
    name="evalkube",
    help="Sandboxed Python graders for LLM evaluations: run suites locally or in Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Piped or captured output has no terminal to fit: keep tables whole rather than at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="EVALKUBE_DB",
        help=f"Results store URL or SQLite path [default: {DEFAULT_DB}]",
    ),
]


def _store_url(db: str | None) -> str:
    db = db or DEFAULT_DB
    if "://" in db:
        return db
    path = Path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _open_store(db: str | None) -> ResultStore:
    try:
        return ResultStore.open(_store_url(db))
    except StoreError as exc:
        _fail(str(exc), EXIT_RUNTIME)


def _fail(message: str, code: int) -> NoReturn:
    # messages quote user input (task ids in brackets, YAML, code): never parse them as markup
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, with lone surrogates (a grader may return them) as ``\\udXXX``
    escapes: valid JSON inside a JSON string, and readable on a terminal."""
    return text.encode("utf-8", "backslashreplace")


def _results_table(summary: RunSummary) -> Table:
    table = Table(title=f"{summary.suite} · run {summary.run_id}", title_justify="left")
    table.add_column("task", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("metrics", overflow="fold")
    for column in ("samples", "valid", "invalid", "errored"):
        table.add_column(column, justify="right", min_width=len(column), no_wrap=True)
    with_criteria = any(result.criteria for result in summary.results)
    if with_criteria:
        table.add_column("passed/failed", overflow="fold")
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
            *(
                [
                    "\n".join(
                        f"{escape(name)}: {c.passed}/{c.failed}"
                        for name, c in result.criteria.items()
                    )
                    or "-"
                ]
                if with_criteria
                else []
            ),
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
        output.write_text(json.dumps(summary.to_json(), indent=2) + "\n")


def _bridge_factory() -> Any:
    try:
        from evalkube.proxy.bridge import local_model_access
    except ImportError:
        return None
    return local_model_access


@app.command()
def runs(db: DbOption = None, limit: Annotated[int, typer.Option(min=1)] = 20) -> None:
    """List recent runs in the store."""
    store = _open_store(db)
    try:
        records = store.list_runs(limit)
    finally:
        store.close()
    table = Table("run", "suite", "phase", "sandbox", "created")
    for record in records:
        table.add_row(
            record.run_id,
            record.suite_name,
            record.phase,
            record.sandbox,
            str(record.created_at)[:19],
        )
    console.print(table)


@app.command()
def samples(
    run_id: Annotated[
        str, typer.Argument(help="Run id (see `evalkube runs`), or the EvalRun name with --api")
    ],
    status: Annotated[str | None, typer.Option(help="failed|valid|invalid|errored")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1_000)] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    db: DbOption = None,
    api: Annotated[
        str | None,
        typer.Option(envvar="EVALKUBE_API", help="Read from the operator's samples API (URL)"),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="With --api")] = "default",
) -> None:
    """Show samples of a run: prompt, target, output, extraction, scores, judge, error."""
    if status is not None and status not in STATUS_FILTERS:
        _fail(f"--status must be one of {', '.join(STATUS_FILTERS)}", EXIT_CONFIG)
    if api is not None:
        views = _api_samples(api, namespace, run_id, status, task, model, limit)
    else:
        store = _open_store(db)
        try:
            if store.get_run(run_id) is None:
                _fail(
                    f"run {run_id!r} is not in the store; list runs with `evalkube runs`",
                    EXIT_CONFIG,
                )
            records, _ = store.page_samples(
                run_id,
                task_id=task,
                model=model,
                status=STATUS_FILTERS.get(status or ""),
                limit=limit,
            )
        finally:
            store.close()
        views = [sample_view(r) for r in records]
    if as_json:
        sys.stdout.flush()
        sys.stdout.buffer.write(_utf8(json.dumps(views, indent=2, ensure_ascii=False) + "\n"))
        sys.stdout.buffer.flush()
        return
    if not views:
        console.print("no samples match")
    for view in views:
        lines = []
        for key in (
            "prompt",
            "target",
            "output_text",
            "extracted_output",
            "scores",
            "judge",
            "error",
            "stdout",
            "stderr",
        ):
            value = view[key]
            if value is None or value == {}:
                continue
            text = (
                value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
            )
            lines.append(f"[bold]{key}[/]: {escape(_utf8(text).decode())}")
        color = {"valid": "green", "invalid": "yellow", "errored": "red"}.get(
            view["status"], "white"
        )
        console.print(
            Panel(
                "\n".join(lines),
                title=(
                    f"{view['sample_id']} · {view['task_id']} · {escape(view['model'])} · "
                    f"[{color}]{view['status']}[/]"
                ),
                title_align="left",
            ),
            highlight=False,
        )


def _api_samples(
    api: str,
    namespace: str,
    name: str,
    status: str | None,
    task: str | None,
    model: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """One page of the debugging view from ``GET .../evalruns/{name}/samples``."""
    import httpx

    params = {"status": status, "task": task, "model": model, "limit": str(limit)}
    url = f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/evalruns/{name}/samples"
    try:
        token = os.environ.get("EVALKUBE_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx.get(
            url, params={k: v for k, v in params.items() if v}, headers=headers, timeout=30
        )
    except httpx.HTTPError as exc:
        _fail(f"cannot reach the samples API at {api}: {exc}", EXIT_RUNTIME)
    if response.status_code != 200:
        try:
            detail = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = response.text[:300]
        _fail(f"samples API answered HTTP {response.status_code}: {detail}", EXIT_CONFIG)
    views: list[dict[str, Any]] = response.json()["samples"]
    return views


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

    from evalkube.engine.openai_import import import_openai

    try:
        document = json.loads(export.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _fail(f"{export}: cannot read the export as JSON ({exc})", EXIT_CONFIG)
    try:
        suite, run_resource = import_openai(document, name)
    except ConfigError as exc:
        _fail(f"{export}: {exc}", EXIT_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    for filename, resource in (("suite.yaml", suite), ("run.yaml", run_resource)):
        (out / filename).write_text(
            yaml.safe_dump(resource.to_wire(), sort_keys=False, allow_unicode=True)
        )
    rows = suite.spec.tasks[0].dataset.rows or []
    console.print(
        f"[green]ok[/]: {out / 'suite.yaml'} ({len(rows)} items, "
        f"{len(suite.spec.tasks[0].criteria)} criteria) and {out / 'run.yaml'}"
    )


@app.command()
def version() -> None:
    """Print the evalkube version."""
    console.print(__version__)


def _mount_subcommands() -> None:
    from evalkube.controller.crds_cli import crds
    from evalkube.proxy import cli as proxy_cli

    app.command("crds")(crds)
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
