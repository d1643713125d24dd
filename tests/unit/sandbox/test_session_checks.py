"""How the runner judges the worker's frames: tokens, sequence, batch ends.

The worker is untrusted: a frame that does not carry its batch's token, answers out of
sequence, or a batch that ends early is a protocol violation (the session then kills the
worker and blames the execution in flight).
"""

from __future__ import annotations

import os

from evalkube.sandbox import ProcessBackend
from evalkube.sandbox.session import GraderSandbox, _Batch


def _batch(size: int = 3) -> _Batch:
    return _Batch("grader", [(i, [i], None) for i in range(size)], os.urandom(8).hex())


def test_answers_in_sequence_are_accepted() -> None:
    batch = _batch()
    first = GraderSandbox._accept(
        batch, {"t": "results", "b": batch.token, "start": 0, "answers": [1, 2]}
    )
    assert first == [(0, 1), (1, 2)]
    assert GraderSandbox._accept(batch, {"t": "running", "b": batch.token, "i": 2}) == "running"
    assert GraderSandbox._accept(
        batch, {"t": "results", "b": batch.token, "start": 2, "answers": [3]}
    )
    assert GraderSandbox._accept(batch, {"t": "done", "b": batch.token, "n": 3}) == "done"


def test_a_frame_without_the_batch_token_is_a_violation() -> None:
    batch = _batch()
    for frame in (
        {"t": "results", "start": 0, "answers": [99.0]},
        {"t": "results", "b": "guess", "start": 0, "answers": [99.0]},
        {"t": "done", "n": 3},
    ):
        outcome = GraderSandbox._accept(batch, frame)
        assert isinstance(outcome, str)
        assert "did not write" in outcome
    assert batch.answered == 0


def test_out_of_sequence_answers_are_violations() -> None:
    batch = _batch()
    token = batch.token
    assert "expected" in str(
        GraderSandbox._accept(batch, {"t": "results", "b": token, "start": 1, "answers": [1]})
    )
    assert "more answers" in str(
        GraderSandbox._accept(
            batch, {"t": "results", "b": token, "start": 0, "answers": [1, 2, 3, 4]}
        )
    )
    assert "expected" in str(GraderSandbox._accept(batch, {"t": "running", "b": token, "i": 1}))
    assert "before every" in str(GraderSandbox._accept(batch, {"t": "done", "b": token, "n": 3}))
    assert "not an object" in str(GraderSandbox._accept(batch, ["results"]))
    assert batch.answered == 0


def test_blame_goes_to_the_first_unanswered_execution() -> None:
    batch = _batch()
    batch.answered = 1
    failure = GraderSandbox._blame(batch, "crashed", "WorkerCrashed", "boom")
    assert failure is not None
    assert (failure.index, failure.status) == (1, "crashed")
    batch.answered = 3
    assert GraderSandbox._blame(batch, "crashed", "WorkerCrashed", "boom") is None


def test_every_batch_of_a_session_gets_its_own_unguessable_token() -> None:
    sandbox = GraderSandbox(ProcessBackend(), [], task_id="t")
    other = GraderSandbox(ProcessBackend(), [], task_id="t")
    tokens = [next(sandbox._tokens) for _ in range(100)]
    assert len(set(tokens)) == 100
    assert next(other._tokens).split("-")[0] != tokens[0].split("-")[0]
