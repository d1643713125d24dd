"""``evalkube compare``: one run against a baseline, metric by metric, over the samples both
graded (from the store, or from the operator's API)."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from evalkube.reporting.console import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    DbOption,
    NamespaceOption,
    console,
    fail,
    open_store,
    shown_store,
)


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
    namespace: NamespaceOption = "default",
) -> None:
    """Per-metric change of RUN against BASELINE over the samples both graded, with a paired
    bootstrap confidence interval, and the samples whose score changed."""
    from evalkube.grading.compare import compare_runs, compare_scores
    from evalkube.reporting.compare_tables import comparison_table, flipped_table

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
            fail(str(exc), EXIT_RUNTIME if exc.unreachable else EXIT_CONFIG)
    else:
        with open_store(db) as store:
            for name in (baseline, run_id):
                if store.get_run(name) is None:
                    fail(f"run {name!r} not found in {shown_store(db)}", EXIT_CONFIG)
            deltas = compare_runs(store, baseline, run_id, confidence=confidence)
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
