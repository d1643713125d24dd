"""Keep every model answer the moment it arrives, so that no paid call is ever made twice.

A shard's candidates are all generated before its first sample is graded and stored; a run
stopped in between (Ctrl-C, a crash, a kill) would otherwise lose every answer it paid for.
:class:`AnswerLog` hands each answer to a writer thread that commits whatever has queued up
in one transaction (a group commit: about a millisecond behind the answer, and one
transaction per burst rather than per call), and ``--resume`` takes kept answers back
instead of calling the model again. The local engine owns one per run.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

from evalkube.engine.candidates import Candidate
from evalkube.store import ResultStore

CANDIDATE = "candidate"
#: Answers one transaction takes at most.
_BATCH = 500


def candidate_answer(candidate: Candidate) -> dict[str, Any]:
    """What is kept of a generated candidate (its text, id, latency and the call it cost)."""
    return {
        "output_text": candidate.output_text,
        "response_id": candidate.response_id,
        "ms": candidate.ms,
        "model_calls": candidate.model_calls,
    }


def kept_candidate(answer: dict[str, Any]) -> Candidate:
    return Candidate(
        output_text=answer.get("output_text"),
        response_id=answer.get("response_id"),
        ms=answer.get("ms"),
        model_calls=dict(answer.get("model_calls") or {}),
    )


class AnswerLog:
    """Model answers of one run, committed on a background thread as they arrive."""

    def __init__(self, store: ResultStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="evalkube-answers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[tuple[str, Any]] = []
            stop = item is None
            if item is not None:
                batch.append(item)
            while not stop and len(batch) < _BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batch.append(more)
            try:
                if batch and self._error is None:
                    self.store.record_answers(self.run_id, CANDIDATE, batch)
            except BaseException as exc:  # raised to the runner by flush()
                self._error = exc
            finally:
                for _ in range(len(batch) + (1 if stop else 0)):
                    self._queue.task_done()
            if stop:
                return

    def add(self, sample_id: str, candidate: Candidate) -> None:
        """Keep a candidate that cost a model call (failed calls are made again on resume)."""
        if candidate.error is None and candidate.model_calls.get(CANDIDATE):
            self._queue.put((sample_id, candidate_answer(candidate)))

    def kept(self, sample_ids: Sequence[str]) -> dict[str, Candidate]:
        """Candidates already paid for, by sample id."""
        found = self.store.recorded_answers(self.run_id, CANDIDATE, sample_ids)
        return {sid: kept_candidate(answer) for sid, answer in found.items()}

    def retry_ids(self, task_id: str, model: str) -> set[str]:
        """Recorded samples whose model call failed: call again."""
        return self.store.generation_errored_ids(self.run_id, task_id, model)

    def flush(self) -> None:
        """Wait until every answer handed over so far is committed; raise a write error."""
        self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._queue.put(None)
            self._thread.join(timeout=30)
