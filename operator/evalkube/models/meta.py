"""The slice of Kubernetes ObjectMeta that evalkube reads from manifests."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from evalkube.models.base import SpecModel


class ObjectMeta(SpecModel):
    """Object metadata; fields evalkube does not use are kept but not validated."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=253)
    """Object name."""
    namespace: str | None = None
    """Namespace (cluster runs)."""
