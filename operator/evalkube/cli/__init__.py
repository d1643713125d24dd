"""``evalkube``: run suites on this machine, inspect samples, and start the cluster parts.

Exit codes: 0 the run finished and printed its scores (invalid samples included);
2 configuration error (bad YAML, spec, dataset, provider or key, grader that does not load;
a run that had started ends ``Failed``); 3 the run could not complete (sandbox or store
failure, ``Failed``); 4 stopped by ``--max-error-rate`` (``Failed``); 130 interrupted
(``Interrupted``; resume with ``--resume RUN_ID``).

One module per command family (registered below, in ``--help`` order).
"""

from __future__ import annotations

import os

import typer

from evalkube import __version__
from evalkube.cli import compare, importers, in_cluster, run
from evalkube.controller.crds_cli import crds
from evalkube.proxy import cli as proxy_cli
from evalkube.reporting.console import console
from evalkube.reporting.report import report
from evalkube.reporting.runs import runs
from evalkube.reporting.samples import samples
from evalkube.reporting.track import track

app = typer.Typer(
    name="evalkube",
    help="Sandboxed Python graders for LLM evaluations: run suites locally or in Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def version() -> None:
    """Print the evalkube version."""
    console.print(__version__)


for command in (run.run, compare.compare, run.validate, run.submit, version, crds):
    app.command()(command)
for reporting_command in (runs, samples, report, track):
    app.command()(reporting_command)
proxy_cli.register(app)
for in_cluster_command in (in_cluster.operator, in_cluster.unit, in_cluster.prepare):
    app.command()(in_cluster_command)
import_app = typer.Typer(help="Convert evals from other systems into EvalSuite/EvalRun files.")
import_app.command("openai")(importers.import_openai)
app.add_typer(import_app, name="import")  # groups follow the commands in --help


def main() -> None:  # pragma: no cover - console entry
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
