"""The engine every path shares: planning units, and running one unit (candidates,
sandboxed grading, validation, recording) for ``evalkube run``, a work-unit pod's runner and
the operator's plan alike. Whole local runs are :mod:`evalkube.local`'s.
"""

from __future__ import annotations

from evalkube.engine.loading import LoadedSuite, load_files, resolve_run_spec
from evalkube.engine.plan import Unit, plan_units, sample_id
from evalkube.engine.unit_context import Progress, UnitFailed
from evalkube.grading.run_results import aggregate_results
from evalkube.models.errors import ConfigError

__all__ = [
    "ConfigError",
    "LoadedSuite",
    "Progress",
    "Unit",
    "UnitFailed",
    "aggregate_results",
    "load_files",
    "plan_units",
    "resolve_run_spec",
    "sample_id",
]
