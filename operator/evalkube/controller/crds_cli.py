"""``evalkube crds``: write the CRDs generated from the models, or check them for drift.

CI runs ``evalkube crds --check``, which exits 1 and names each stale file when the models
changed without regenerating. By default both copies are handled: ``crds/`` (``kubectl apply
-f crds/``) and ``charts/evalkube/crds/`` (Helm installs CRDs from there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalkube.controller.crds import check_crds, write_crds

#: Where the repository keeps the generated CRDs (relative to the repository root).
DEFAULT_OUTPUT_DIRS = (Path("crds"), Path("charts/evalkube/crds"))


def crds(
    check: Annotated[
        bool,
        typer.Option("--check", help="Do not write; exit 1 if the files differ from the models."),
    ] = False,
    output_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Directory to write (repeatable) [default: crds and charts/evalkube/crds]",
        ),
    ] = None,
) -> None:
    """Generate the CustomResourceDefinitions (EvalSuite, EvalRun, EvalSchedule) from the models."""
    directories = output_dir or list(DEFAULT_OUTPUT_DIRS)
    if check:
        problems = [p for d in directories for p in check_crds(d)]
        for problem in problems:
            typer.echo(problem, err=True)
        if problems:
            raise typer.Exit(1)
        typer.echo(f"CRDs up to date in {', '.join(str(d) for d in directories)}")
        return
    for directory in directories:
        for path in write_crds(directory):
            typer.echo(str(path))
