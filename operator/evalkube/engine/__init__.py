"""The engine: planning units, running one unit, and running a whole suite locally.

The names below load on first use (PEP 562): the operator imports ``evalkube.engine.plan``
and friends, and importing this package must not drag in the local engine (sandboxes,
process pools) it never runs. ``tests/unit/test_layering.py`` checks that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evalkube.engine.loading import LoadedSuite, load_files, resolve_run_spec
    from evalkube.engine.local import LocalEngine, ModelAccess, RunSummary
    from evalkube.engine.plan import Unit, plan_units, sample_id
    from evalkube.engine.runner import Progress, UnitFailed
    from evalkube.grading.run_results import aggregate_results
    from evalkube.models.errors import ConfigError

_HOMES = {
    "ConfigError": "evalkube.models.errors",
    "LoadedSuite": "evalkube.engine.loading",
    "LocalEngine": "evalkube.engine.local",
    "ModelAccess": "evalkube.engine.local",
    "Progress": "evalkube.engine.runner",
    "RunSummary": "evalkube.engine.local",
    "Unit": "evalkube.engine.plan",
    "UnitFailed": "evalkube.engine.runner",
    "aggregate_results": "evalkube.grading.run_results",
    "load_files": "evalkube.engine.loading",
    "plan_units": "evalkube.engine.plan",
    "resolve_run_spec": "evalkube.engine.loading",
    "sample_id": "evalkube.engine.plan",
}

__all__ = [
    "ConfigError",
    "LoadedSuite",
    "LocalEngine",
    "ModelAccess",
    "Progress",
    "RunSummary",
    "Unit",
    "UnitFailed",
    "aggregate_results",
    "load_files",
    "plan_units",
    "resolve_run_spec",
    "sample_id",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
