"""Statuses as the operator reads, changes and compares them: always as models, never as dicts.

Every status the operator writes (EvalRun, EvalSuite, EvalSchedule) is one of the status
models, so what it writes is what the CRD declares and what ``kubectl`` users, Argo CD's
health checks and the tests read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from evalkube import limits
from evalkube.models.base import SpecModel
from evalkube.models.run import Condition

_log = logging.getLogger(__name__)
S = TypeVar("S", bound=SpecModel)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cap_message(message: str, chars: int = limits.STATUS_MESSAGE_CHARS) -> str:
    """``message`` in at most ``chars`` characters: a longer one is cut, and says how many
    characters it lost. Every message the operator writes into a status or an Event goes
    through this (:data:`~evalkube.limits.STATUS_MESSAGE_CHARS`,
    :data:`~evalkube.limits.EVENT_MESSAGE_CHARS`): messages name units, tasks and errors a
    run can have without bound."""
    if len(message) <= chars:
        return message
    keep = max(0, chars - len(f"... [{len(message)} more characters]"))
    return f"{message[:keep]}... [{len(message) - keep} more characters]"


def list_message(head: str, items: Sequence[str], chars: int, more: str = "") -> str:
    """``head: item; item; ...`` in at most ``chars`` characters: the items that fit, in
    order, then ``; and N more`` (``more``: where to find them all)."""
    out = head
    for shown, item in enumerate(items):
        piece = ("; " if shown else ": ") + item
        after = len(items) - shown - 1
        reserve = len(f"; and {after} more{more}") if after else 0
        if len(out) + len(piece) + reserve > chars:
            return cap_message(f"{out}; and {len(items) - shown} more{more}", chars)
        out += piece
    return cap_message(out, chars)


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int | None
) -> Condition:
    """A condition that changed now (:func:`merge_conditions` keeps the older time when its
    status did not change); its message capped (:func:`cap_message`)."""
    return Condition(
        type=kind,
        status="True" if status else "False",
        reason=reason,
        message=cap_message(message),
        observed_generation=generation,
        last_transition_time=now_rfc3339(),
    )


def merge_conditions(
    old: Sequence[Condition], new: Sequence[Condition], *, keep_others: bool = False
) -> list[Condition]:
    """``new``, each keeping its old ``lastTransitionTime`` when its status did not change;
    with ``keep_others``, old conditions of types ``new`` lacks are kept after them."""
    by_type = {c.type: c for c in old}
    merged = []
    for cond in new:
        previous = by_type.get(cond.type)
        if previous is not None and previous.status == cond.status:
            cond = cond.model_copy(update={"last_transition_time": previous.last_transition_time})
        merged.append(cond)
    if keep_others:
        types = {c.type for c in new}
        merged.extend(c for c in old if c.type not in types)
    return merged


def read_status(model: type[S], raw: Mapping[str, Any] | None) -> S:
    """The status an object holds, as ``model``. Keys the model does not know (kopf's own
    bookkeeping) are ignored; a status that no longer validates (written by hand, or by an
    older operator) starts afresh rather than blocking the object forever."""
    known = {k: v for k, v in (raw or {}).items() if k in _wire_names(model)}
    try:
        return model.model_validate(known)
    except ValidationError as exc:
        _log.warning("ignoring a %s that does not validate: %s", model.__name__, exc)
        return model()


def same_status(a: SpecModel, b: SpecModel) -> bool:
    """Whether two statuses say the same, ignoring when conditions last changed (a pass that
    finds nothing new must not patch)."""

    def comparable(status: SpecModel) -> dict[str, object]:
        wire = status.to_wire()
        wire["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in wire.get("conditions") or []  # type: ignore[attr-defined]
        ]
        return wire

    return comparable(a) == comparable(b)


def _wire_names(model: type[SpecModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()} | set(model.model_fields)
