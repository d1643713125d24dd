"""References to other objects of the run's namespace, shared by the run's specs."""

from __future__ import annotations

from pydantic import Field

from evalkube.models.base import SpecModel
from evalkube.models.crd import cluster


class SecretKeyRef(SpecModel):
    """A key of a Secret in the run's namespace."""

    name: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """Secret name."""
    key: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """Key within the Secret."""


class ConfigMapKeyRef(SpecModel):
    """A key of a ConfigMap in the suite's namespace."""

    name: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """ConfigMap name."""
    key: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """Key within the ConfigMap."""
