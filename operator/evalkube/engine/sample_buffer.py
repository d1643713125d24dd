"""Samples on their way to the store: collected, charged their model calls, written in chunks."""

from __future__ import annotations

from typing import Any

from evalkube import limits
from evalkube.engine.plan import Unit
from evalkube.engine.unit_context import UnitContext
from evalkube.store import SampleRecord, SampleWriter
from evalkube.util import jsonfast


def record_bytes(record: SampleRecord) -> int:
    """About how many bytes ``record`` takes once encoded for the store: its texts and its
    judge (up to :data:`limits.RESULT_PAYLOAD_BYTES` each), the part a grader controls."""
    size = 512
    for text in (record.output_text, record.extracted_output, record.target, record.stdout):
        size += len(text) if text else 0
    size += len(record.stderr) if record.stderr else 0
    for value in (record.judge, record.error, record.prompt, record.dataset_row):
        if value is not None:
            size += len(value) if isinstance(value, str) else len(jsonfast.dumps(value))
    return size


class SampleBuffer:
    """Collects records and hands them to the store in chunks (on a writer thread)."""

    def __init__(self, ctx: UnitContext, unit: Unit) -> None:
        self.ctx, self.unit = ctx, unit
        self.records: list[SampleRecord] = []
        #: Estimated bytes of :attr:`records` (flushed at :data:`limits.STORE_CHUNK_BYTES`).
        self.bytes = 0
        self.written = 0
        self.shared = ctx.writer is not None
        self.writer = ctx.writer if ctx.writer is not None else SampleWriter(ctx.store)
        #: The execution tokens (one per criterion) of each graded sample whose usage is
        #: not taken yet.
        self.tokens: dict[str, list[str]] = {}

    def add(self, record: SampleRecord) -> None:
        guard = self.ctx.guard
        if guard is not None:
            error = record.error if record.status in ("errored", "invalid") else None
            why = None if error is None else f"{error.get('type')}: {error.get('message')}"
            guard.count("samples", record.task_id, record.model, why)
        self.records.append(record)
        self.bytes += record_bytes(record)
        if len(self.records) >= limits.STORE_CHUNK_SIZE or self.bytes >= limits.STORE_CHUNK_BYTES:
            self.submit()

    def submit(self) -> None:
        if not self.records:
            return
        if self.ctx.bridge is not None:
            self._attach_usage()
        self.writer.submit(self.records)
        if self.ctx.observe is not None:
            self.ctx.observe(self.records)
        self.ctx.progress.advance(self.unit, len(self.records))
        self.written += len(self.records)
        for record in self.records:
            # encoded for the store already; the shard's samples stay listed until the unit
            # ends, so a judge of up to 1 MB each would otherwise stay in memory with them
            record.judge = None
        self.records = []
        self.bytes = 0

    def close(self) -> None:
        """Submit what is left; with its own writer, wait until every sample is committed."""
        try:
            self.submit()
        finally:
            if not self.shared:
                self.writer.close()

    def _attach_usage(self) -> None:
        assert self.ctx.bridge is not None
        tokens = self.tokens
        owned = [(r, tokens.pop(r.sample_id)) for r in self.records if r.sample_id in tokens]
        if not owned:
            return
        opened = [token for _, ts in owned for token in ts]
        usage = self.ctx.bridge.take_usage(opened)
        if self.ctx.answers is not None:
            self.ctx.answers.unlabel(opened)
        for record, ts in owned:
            for token in ts:
                self._merge_usage(record, usage.get(token))

    @staticmethod
    def _merge_usage(record: SampleRecord, calls: dict[str, Any] | None) -> None:
        if not calls:
            return
        merged = dict(record.model_calls)
        for purpose, count in (calls.get("by_purpose") or {}).items():
            merged[purpose] = merged.get(purpose, 0) + int(count)
        retries = int(calls.get("retries") or 0)  # sent again, maybe billed: counted
        if retries:
            merged["retries"] = merged.get("retries", 0) + retries
        ids = list(merged.get("response_ids", [])) + list(calls.get("response_ids") or [])
        if ids:
            merged["response_ids"] = ids
        record.model_calls = merged
