"""``evalkube import``: evals from other systems as EvalSuite/EvalRun files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from evalkube import limits
from evalkube.engine import ConfigError
from evalkube.reporting.console import EXIT_CONFIG, console, fail


def import_openai(
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
        fail(str(exc), EXIT_CONFIG)
    except ValueError as exc:
        fail(f"{export}: cannot read the export as JSON ({str(exc)[:200]})", EXIT_CONFIG)
    except RecursionError:
        fail(f"{export}: the export's JSON nests too deeply", EXIT_CONFIG)
    try:
        imported = import_openai(document, name)
    except ConfigError as exc:
        fail(f"{export}: {exc}", EXIT_CONFIG)
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
