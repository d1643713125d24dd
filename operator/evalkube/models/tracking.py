"""``spec.tracking`` of an EvalRun: where a finished run is also logged (MLflow)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from evalkube.models.base import SpecModel
from evalkube.models.crd import cluster
from evalkube.models.refs import SecretKeyRef

#: What the operator can reach: an MLflow tracking server over HTTP(S).
HTTP_URI = re.compile(r"^https?://[^\s/]+")


class MlflowTrackingSpec(SpecModel):
    """An MLflow tracking server the run is logged to, as one MLflow run, once it finished.

    The operator (never a work pod) logs it, in the background: a server that is down never
    fails or delays the run; the run's ``Tracked`` condition says what happened.
    """

    tracking_uri: str = Field(
        min_length=1,
        validation_alias="trackingURI",
        serialization_alias="trackingURI",
        json_schema_extra=cluster(max_length=2_048, pattern=HTTP_URI.pattern),
    )
    """The tracking server, for example ``http://mlflow.mlflow.svc:5000``."""
    experiment: str | None = Field(default=None, min_length=1, max_length=500)
    """Experiment name; default ``evalkube/<namespace>/<schedule>`` for a scheduled run (so
    a schedule's runs plot over time) and ``evalkube/<namespace>/<suite>`` otherwise."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret key holding a bearer token (``MLFLOW_TRACKING_TOKEN``), read by the operator
    only; the chart's ``rbac.trackingSecrets`` must name the Secret."""
    username: str | None = Field(default=None, json_schema_extra=cluster(max_length=253))
    """User for basic authentication (with ``passwordSecretRef``)."""
    password_secret_ref: SecretKeyRef | None = None
    """Secret key holding the basic-authentication password, read by the operator only."""

    @field_validator("tracking_uri")
    @classmethod
    def _http(cls, value: str) -> str:
        if not HTTP_URI.match(value):
            raise ValueError(
                f"trackingURI {value!r} must be an http:// or https:// URL of an MLflow "
                "tracking server"
            )
        return value


class TrackingSpec(SpecModel):
    """Experiment trackers a finished run is logged to."""

    mlflow: MlflowTrackingSpec | None = None
    """Log the run to an MLflow tracking server."""
