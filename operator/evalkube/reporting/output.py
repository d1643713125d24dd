"""``evalkube run --output FILE``: the run's results as JSON, with its samples if asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalkube.reporting.console import open_store
from evalkube.reporting.export import store_views, text_stream, write_json
from evalkube.store.filters import SampleFilter


def write_run_output(
    path: Path, summary: dict[str, Any], db: str | None = None, samples: bool = False
) -> None:
    """Write ``summary`` (``RunSummary.to_json()``) to ``path``; with ``samples``, add a
    ``"samples"`` array of every sample's view (as ``evalkube samples --json`` gives them),
    streamed from the store at ``db`` a page at a time."""
    if not samples:
        path.write_text(json.dumps(summary, indent=2) + "\n")
        return
    head = json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=2)
    with open_store(db) as store, path.open("wb") as binary, text_stream(binary) as out:
        out.write(head[: head.rindex("}")].rstrip() + ',\n  "samples": ')
        write_json(store_views(store, summary["run_id"], SampleFilter()), out)
        out.write("}\n")
