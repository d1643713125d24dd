"""Every run's ``spec`` is its snapshot (:class:`evalkube.models.snapshot.RunSnapshot`).

Before, ``evalkube run`` stored a plain document (``suite``, ``run``, ``base_dir``, ...) and the
operator wrapped its snapshot (``{namespace, name, snapshot}``), so every reader branched on
the two shapes. This rewrites both into the one document; the downgrade writes them back.
The rows are rewritten as JSON, without the models: a revision must keep meaning what it
meant when it was written.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_runs = sa.table(
    "evalkube_runs",
    sa.column("run_id", sa.String),
    sa.column("suite_version", sa.String),
    sa.column("spec", sa.Text),
)


def _to_snapshot(run_id: str, version: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The snapshot of a row in either old shape; ``None`` when it is neither (left alone)."""
    if isinstance(spec.get("snapshot"), dict):  # the operator's
        return dict(spec["snapshot"])
    suite, run = spec.get("suite"), spec.get("run")
    if not isinstance(suite, dict) or not isinstance(run, dict) or "base_dir" not in spec:
        return None
    local: dict[str, Any] = {"base_dir": spec["base_dir"]}
    if spec.get("suite_file"):
        local["suite_file"] = spec["suite_file"]
    for key in ("pins", "reloads"):
        if spec.get(key):
            local[key] = spec[key]
    return {
        "run": {"run_id": run_id},
        "suite": {
            "name": (suite.get("metadata") or {}).get("name", ""),
            "spec": suite.get("spec") or {},
            "version": version,
        },
        "run_spec": run,
        "sources": spec.get("sources") or {},
        "local": local,
    }


def _to_old(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The old shape of a snapshot; ``None`` when the row is not one (left alone)."""
    run, local = spec.get("run"), spec.get("local")
    if not isinstance(run, dict) or "run_spec" not in spec:
        return None
    if not isinstance(local, dict):
        return {"namespace": run.get("namespace"), "name": run.get("name"), "snapshot": spec}
    suite = spec.get("suite") or {}
    return {
        "suite": {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalSuite",
            "metadata": {"name": suite.get("name", "")},
            "spec": suite.get("spec") or {},
        },
        "run": spec["run_spec"],
        "base_dir": local.get("base_dir"),
        "suite_file": local.get("suite_file"),
        "sources": spec.get("sources") or {},
        "pins": local.get("pins") or {},
        **({"reloads": local["reloads"]} if local.get("reloads") else {}),
    }


def _rewrite(convert: Any) -> None:
    connection = op.get_bind()
    rows = connection.execute(sa.select(_runs.c.run_id, _runs.c.suite_version, _runs.c.spec))
    for run_id, version, text in rows.fetchall():
        try:
            spec = json.loads(text)
        except ValueError:
            continue
        new = convert(run_id, version, spec) if isinstance(spec, dict) else None
        if new is not None:
            connection.execute(
                _runs.update().where(_runs.c.run_id == run_id).values(spec=json.dumps(new))
            )


def upgrade() -> None:
    _rewrite(_to_snapshot)


def downgrade() -> None:
    _rewrite(lambda _run_id, _version, spec: _to_old(spec))
