"""Keep every model answer the moment it arrives, so that no paid call is ever made twice.

A shard's candidates are all generated before its first sample is graded and stored, and
graded samples are stored a chunk at a time; a run stopped in between (Ctrl-C, a crash, a
kill) would otherwise lose answers it paid for. :class:`AnswerLog` hands each answer to a
writer thread that commits whatever has queued up in one transaction (a group commit: one
transaction per burst rather than per call), and ``--resume`` takes kept answers back
instead of calling the model again:

- candidates, by sample id;
- the model calls a grader makes through ``ctx`` (the local model bridge asks
  :meth:`AnswerLog.replay` before calling a provider and hands each answer to
  :meth:`AnswerLog.keep`): by sample, in the order the grader made them, each with a digest
  of its request. A resumed grader that makes the same requests gets the same answers; from
  its first different request on, it calls the provider again.

The local engine owns one per run.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any, Protocol

from evalkube.engine.candidates import Candidate

CANDIDATE = "candidate"
#: Kept answers of a grader's ``ctx`` calls, a list per sample.
GRADER_CALLS = "ctx"
#: Answers one transaction takes at most.
_BATCH = 500


def candidate_answer(candidate: Candidate) -> dict[str, Any]:
    """What is kept of a generated candidate (its text, tool calls, OpenAI's further sample
    fields, id, latency and the call it cost)."""
    return {
        "output_text": candidate.output_text,
        "output_tools": candidate.output_tools,
        "sample_extra": candidate.sample_extra,
        "response_id": candidate.response_id,
        "ms": candidate.ms,
        "model_calls": candidate.model_calls,
    }


def kept_candidate(answer: dict[str, Any]) -> Candidate:
    tools, extra = answer.get("output_tools"), answer.get("sample_extra")
    return Candidate(
        output_text=answer.get("output_text"),
        output_tools=list(tools) if isinstance(tools, list) else [],
        sample_extra=dict(extra) if isinstance(extra, dict) else {},
        response_id=answer.get("response_id"),
        ms=answer.get("ms"),
        model_calls=dict(answer.get("model_calls") or {}),
    )


class AnswerStore(Protocol):
    """Where answers are kept: the results store, or (in a work-unit pod) the operator's
    ingest API through :class:`~evalkube.store.remote.RemoteStore`."""

    def record_answers(
        self, run_id: str, purpose: str, answers: Sequence[tuple[str, Any]]
    ) -> None: ...

    def recorded_answers(
        self, run_id: str, purpose: str, sample_ids: Sequence[str]
    ) -> dict[str, Any]: ...

    def generation_errored_ids(
        self, run_id: str, task_id: str, model: str, seqs: tuple[int, int] | None = None
    ) -> set[str]: ...


class AnswerLog:
    """Model answers of one run, committed on a background thread as they arrive.

    ``grader_calls``: whether graders' ``ctx`` calls are kept too (they are where the model
    bridge runs in-process; in a pod the sidecar makes them)."""

    def __init__(self, store: AnswerStore, run_id: str, *, grader_calls: bool = True) -> None:
        self.store, self.run_id = store, run_id
        self.grader_calls = grader_calls
        self._queue: queue.Queue[tuple[str, str, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        #: Execution token -> sample id, for the grader executions in flight.
        self._samples: dict[str, str] = {}
        #: Calls each execution has made so far (its position in its sample's list).
        self._made: dict[str, int] = {}
        #: Sample id -> ``[{"key", "answer"}]``: kept before (resume) and kept since.
        self._calls: dict[str, list[dict[str, str]]] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="evalkube-answers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            batch: list[tuple[str, str, Any]] = []
            item = self._queue.get()
            while item is not None:  # take what has queued up, up to _BATCH
                batch.append(item)
                if len(batch) >= _BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stop = item is None
            try:
                if batch and self._error is None:
                    batch.sort(key=lambda item: item[0])
                    for purpose, group in groupby(batch, key=lambda item: item[0]):
                        # a sample's later list replaces its earlier one in the same batch
                        latest = {sample_id: answer for _, sample_id, answer in group}
                        self.store.record_answers(self.run_id, purpose, list(latest.items()))
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
            self._queue.put((CANDIDATE, sample_id, candidate_answer(candidate)))

    def kept(self, sample_ids: Sequence[str]) -> dict[str, Candidate]:
        """Candidates already paid for, by sample id."""
        found = self.store.recorded_answers(self.run_id, CANDIDATE, sample_ids)
        return {sid: kept_candidate(answer) for sid, answer in found.items()}

    # -- a grader's model calls (called by the runner, and on the bridge's thread) ----------
    def label(self, executions: Mapping[str, str], *, resuming: bool) -> None:
        """Grader executions about to run: token -> sample id. ``resuming``: load the calls
        kept for those samples by the run's earlier attempt."""
        kept: dict[str, Any] = {}
        if resuming and self.grader_calls:
            kept = self.store.recorded_answers(self.run_id, GRADER_CALLS, list(executions.values()))
        with self._lock:
            self._samples.update(executions)
            for sample_id in executions.values():
                self._calls[sample_id] = list(kept.get(sample_id) or [])

    def unlabel(self, tokens: Sequence[str]) -> None:
        """Those executions are over (their usage was taken)."""
        with self._lock:
            for token in tokens:
                sample_id = self._samples.pop(token, None)
                self._made.pop(token, None)
                if sample_id is not None:
                    self._calls.pop(sample_id, None)

    def replay(self, execution_id: str, kind: str, body: Mapping[str, Any]) -> bytes | None:
        """The kept answer of this call, when the execution's earlier attempt made the same
        request at the same point; else ``None`` (call the provider)."""
        key = _request_key(kind, body)
        with self._lock:
            sample_id = self._samples.get(execution_id)
            if sample_id is None:
                return None
            calls = self._calls.get(sample_id, [])
            position = self._made.get(execution_id, 0)
            if position < len(calls) and calls[position]["key"] == key:
                self._made[execution_id] = position + 1
                return calls[position]["answer"].encode()
            del calls[position:]  # the grader went another way: the rest is stale
            return None

    def keep(self, execution_id: str, kind: str, body: Mapping[str, Any], answer: bytes) -> None:
        """A provider's answer to an execution's call: keep it for its sample."""
        with self._lock:
            sample_id = self._samples.get(execution_id)
            if sample_id is None:
                return
            calls = self._calls.setdefault(sample_id, [])
            position = self._made.get(execution_id, 0)
            del calls[position:]
            calls.append(
                {"key": _request_key(kind, body), "answer": answer.decode(errors="replace")}
            )
            self._made[execution_id] = position + 1
            self._queue.put((GRADER_CALLS, sample_id, list(calls)))

    def retry_ids(self, task_id: str, model: str, seqs: tuple[int, int] | None = None) -> set[str]:
        """Recorded samples whose model call failed (``seqs``: of one shard): call again."""
        return self.store.generation_errored_ids(self.run_id, task_id, model, seqs)

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


def _request_key(kind: str, body: Mapping[str, Any]) -> str:
    """A digest of what was asked (the same request asks the same, whatever its key order)."""
    text = json.dumps([kind, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
