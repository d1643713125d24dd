"""The engine: planning units, running one unit, and running a whole suite locally."""

from evalkube.engine.loading import ConfigError, LoadedSuite, load_files, resolve_run_spec
from evalkube.engine.local import LocalEngine, ModelAccess, RunSummary, aggregate_results
from evalkube.engine.plan import Unit, plan_units, sample_id
from evalkube.engine.runner import Progress, UnitFailed

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
