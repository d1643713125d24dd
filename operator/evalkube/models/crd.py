"""What the CRDs add to a model for the API server: cluster-only bounds and CEL rules.

A field says ``Field(..., json_schema_extra=cluster(max_length=65_536))``; a model says
``model_config = ConfigDict(json_schema_extra=cel(Rule(...)))``; both combine with ``|``.

- Bounds go under the private key :data:`CLUSTER_KEY`, which no JSON-schema validator and no
  pydantic validation reads: ``evalkube run`` accepts what it accepted before, and the CRD
  generator (:mod:`evalkube.controller.crds`) folds them into the structural schema. They
  exist because CEL rules are only admitted when their worst-case cost is bounded and an
  object must fit in etcd (1.5 MiB). A bound the model itself declares wins.
- CEL rules (``x-kubernetes-validations``) repeat the cross-field checks the models make in
  Python, so the API server rejects a bad object at ``kubectl apply`` with a message naming
  the field. They apply wherever the model appears (an EvalSchedule's run template too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

__all__ = ["CLUSTER_KEY", "RULES_KEY", "Rule", "cel", "cluster", "present"]

#: Private JSON-schema key holding a node's cluster-only keywords.
CLUSTER_KEY: Final = "x-evalkube-crd"
#: The CRD's own key for CEL rules; tools other than the API server ignore it.
RULES_KEY: Final = "x-kubernetes-validations"

JsonDict = dict[str, JsonValue]


@dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` entry."""

    rule: str
    message: str = ""
    message_expression: str = ""
    reason: str = ""
    field_path: str = ""

    def to_schema(self) -> JsonDict:
        """The entry as the CRD spells it (unset keys left out)."""
        optional = {
            "message": self.message,
            "messageExpression": self.message_expression,
            "reason": self.reason,
            "fieldPath": self.field_path,
        }
        return {"rule": self.rule, **{key: value for key, value in optional.items() if value}}


def present(name: str) -> str:
    """CEL: the optional field ``name`` of ``self`` is set.

    ``has()`` is false for an explicit ``null`` of a nullable field (and a non-nullable
    ``null`` is pruned before validation), so ``source: null`` counts as absent, as in the CLI.
    """
    return f"has(self.{name})"


def cluster(
    *,
    max_length: int | None = None,
    max_items: int | None = None,
    max_properties: int | None = None,
    pattern: str | None = None,
    required: list[str] | None = None,
) -> JsonDict:
    """Keywords only the CRD enforces (``required`` lists wire names, added to the model's)."""
    given: dict[str, JsonValue] = {
        "maxLength": max_length,
        "maxItems": max_items,
        "maxProperties": max_properties,
        "pattern": pattern,
        "required": None if required is None else [*required],
    }
    return {CLUSTER_KEY: {key: value for key, value in given.items() if value is not None}}


def cel(*rules: Rule) -> JsonDict:
    """CEL rules of the field or model, in the order given."""
    return {RULES_KEY: [r.to_schema() for r in rules]}
