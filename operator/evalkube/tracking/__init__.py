"""Logging finished runs to experiment trackers (MLflow), for ``evalkube run`` and the operator.

:mod:`~evalkube.tracking.content` decides what a run becomes (pure); :mod:`~evalkube.tracking.
mlflow_log` talks to the tracking server with the MLflow client, retried within bounds. The
callers run it off their main path: a tracker that is down never fails or delays a run.
"""

from evalkube.tracking.content import RunFacts, TrackedContent, describe
from evalkube.tracking.mlflow_log import (
    Artifact,
    Logged,
    MlflowTarget,
    TrackingFailed,
    log_run,
)

__all__ = [
    "Artifact",
    "Logged",
    "MlflowTarget",
    "RunFacts",
    "TrackedContent",
    "TrackingFailed",
    "describe",
    "log_run",
]
