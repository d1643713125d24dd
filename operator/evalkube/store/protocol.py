"""What a unit runner needs from a store: the SQL store locally, the ingest API in a pod."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from evalkube.store.records import SampleRecord, TaskResultRecord


class SampleStore(Protocol):
    """The store operations of :mod:`evalkube.engine` unit stages (all idempotent)."""

    def encode_samples(self, records: Sequence[SampleRecord]) -> Any:
        """Encode records on the caller's thread for :meth:`write_encoded`."""

    def write_encoded(self, payload: Any) -> None:
        """Write encoded records (upsert by sample id)."""

    def record_samples(self, records: Sequence[SampleRecord]) -> None: ...

    def recorded_sample_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]:
        """Ids of recorded samples of the task x model (``seqs``: with sequence numbers in
        ``[low, high)``, one shard's)."""

    def iter_samples(
        self, run_id: str, *, task_id: str | None = None, model: str | None = None
    ) -> Iterator[SampleRecord]: ...

    def apply_sample_updates(self, run_id: str, updates: Iterable[dict[str, Any]]) -> None: ...

    def settle_pending(
        self,
        run_id: str,
        task_id: str,
        model: str,
        status: str,
        values: dict[str, Any] | None = None,
    ) -> int: ...

    def save_task_result(self, result: TaskResultRecord) -> None: ...
