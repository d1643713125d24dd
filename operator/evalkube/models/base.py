"""Shared base for every spec model: camelCase on the wire, snake_case accepted, no unknowns.

The CRDs are generated from these models, so they hold declarations only (no engine logic).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """Base of all specs: CRD spelling (camelCase) with snake_case accepted as well."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=False,
        validate_default=False,
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, object]:
        """Serialize as the Kubernetes API spells it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
