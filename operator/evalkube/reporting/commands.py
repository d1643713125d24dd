"""Registers the reporting commands on the ``evalkube`` app (kept out of ``evalkube.cli``)."""

from __future__ import annotations

import typer

from evalkube.reporting.report import report
from evalkube.reporting.runs import runs
from evalkube.reporting.samples import samples
from evalkube.reporting.track import track


def register(app: typer.Typer) -> None:
    for command in (runs, samples, report, track):
        app.command()(command)
