"""Planning: a run is units of work, one task x one model x one shard of rows.

Tasks whose grader runs ``aggregate`` get one more unit after their shards, which reads the
task's samples back and runs ``grade_batch``. Unit and sample ids are deterministic so a
resumed run (or a restarted operator) finds exactly what was already done.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Literal

UnitKind = Literal["shard", "aggregate"]
#: ``seq`` = shard * SEQ_STRIDE + position: positions inside a shard never collide.
SEQ_STRIDE = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of work."""

    unit_id: str
    task_id: str
    model: str
    kind: UnitKind
    shard: int = 0
    start: int = 0
    stop: int = 0


def seq_range(unit: Unit) -> tuple[int, int]:
    """The ``[low, high)`` sequence numbers of ``unit``'s samples: a shard's own (a
    preprocessor that adds rows still numbers them inside it), or every shard's for an
    aggregate unit. What a pod asks the store for, so it never reads other shards' ids."""
    if unit.kind == "aggregate":
        return 0, 2**63 - 1
    return unit.shard * SEQ_STRIDE, (unit.shard + 1) * SEQ_STRIDE


def model_slug(model: str) -> str:
    """A model id as a name fragment: ``openai:gpt-4.1-mini`` -> ``openai-gpt-4.1-mini``."""
    return re.sub(r"[^a-z0-9.-]+", "-", model.lower()).strip("-") or "model"


def plan_units(
    tasks: list[tuple[str, int, bool]], models: list[str], shard_size: int
) -> list[Unit]:
    """Units for ``(task_id, row_count, aggregate)`` x ``models``, shards then aggregate."""
    units: list[Unit] = []
    for task_id, rows, aggregate in tasks:
        for model in models:
            base = f"{task_id}.{model_slug(model)}"
            shards = max(1, -(-rows // shard_size))
            for shard in range(shards):
                start = shard * shard_size
                stop = min(rows, start + shard_size)
                units.append(
                    Unit(f"{base}.{shard:05d}", task_id, model, "shard", shard, start, stop)
                )
            if aggregate:
                units.append(Unit(f"{base}.batch", task_id, model, "aggregate"))
    return units


@functools.lru_cache(maxsize=256)
def sample_id_prefix(run_id: str, task_id: str, model: str) -> str:
    """The part of sample ids shared by one task x model of a run."""
    digest = hashlib.blake2b(f"{run_id}\0{task_id}\0{model}".encode(), digest_size=5)
    return f"s_{digest.hexdigest()}_"


def sample_id(run_id: str, task_id: str, model: str, seq: int) -> str:
    """Deterministic sample id (stable across resumes and operator restarts).

    Ids of one task x model sort by position, so a unit's inserts append to the store's
    index instead of landing at random places in it.
    """
    return f"{sample_id_prefix(run_id, task_id, model)}{seq:013x}"
