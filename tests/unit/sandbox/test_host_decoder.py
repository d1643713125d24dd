"""The host decodes whatever comes out of a sandbox without ever raising (property tests).

A grader can patch the worker that encodes its answers, so answers and frames are arbitrary
JSON: huge integers, NaN, deep nesting, wrong types, lone surrogates, oversized values. The
host turns each into one :class:`Execution` of a known status (or, for frames, into a
protocol violation) and never lets an exception out of the engine.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from evalkube import limits
from evalkube.grading import validate_return
from evalkube.sandbox.execution import MS_MAX, from_answer
from evalkube.sandbox.protocol import FrameError, read_frame
from evalkube.sandbox.session import GraderSandbox, _Batch
from evalkube.util import jsonfast

STATUSES = {"returned", "raised", "unserializable", "oversized", "protocol_error"}

# JSON-ish values as a patched worker could send them (Python's json writes NaN/Infinity,
# and integers of any size).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**500), max_value=10**500)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None), max_size=30)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
answer_keys = st.sampled_from(
    ["ok", "value", "ms", "stdout", "stderr", "error", "unserializable", "oversized", "x"]
)
answers = st.one_of(
    values,
    st.dictionaries(answer_keys, values, max_size=6),
    st.fixed_dictionaries({"ok": st.just(True), "value": values, "ms": values}),
    st.fixed_dictionaries(
        {
            "ok": st.just(False),
            "error": st.dictionaries(st.sampled_from(["type", "message", "traceback"]), values),
        }
    ),
)


@settings(max_examples=400, deadline=None)
@given(answers)
def test_any_answer_becomes_one_execution(answer: Any) -> None:
    execution = from_answer(7, answer)
    assert execution.index == 7
    assert execution.status in STATUSES
    assert execution.ms is None or (0.0 <= execution.ms <= MS_MAX)
    for text in (execution.stdout, execution.stderr):
        assert text is None or (
            isinstance(text, str) and len(text) <= limits.CAPTURED_OUTPUT_CHARS + 100
        )
    if execution.error is not None:
        assert set(execution.error) == {"type", "message", "traceback"}
        assert all(isinstance(v, str) for v in execution.error.values())
    if execution.status == "returned":
        outcome = validate_return(execution.value, "score")  # the next step never raises either
        assert all(math.isfinite(v) for v in outcome.scores.values())
        jsonfast.dumps(outcome.judge)  # and what it keeps can be stored


def test_the_reported_attacks_are_contained() -> None:
    """The issue's attacks: ``"ms": 10**400`` crashed the run; NaN and negative durations."""
    for ms in (10**400, -1.0, float("nan"), float("inf"), 10**12, True, "12"):
        execution = from_answer(0, {"ok": True, "value": 1.0, "ms": ms})
        assert execution.status == "returned"
        assert execution.ms is None
    nested: Any = 1.0
    for _ in range(5000):
        nested = [nested]
    assert from_answer(0, {"ok": False, "error": {"message": nested}}).status == "raised"
    huge_int = from_answer(0, {"ok": True, "oversized": {"bytes": 10**5000}, "x": 1})
    assert huge_int.status == "oversized"


def _frame(payload: bytes) -> io.BytesIO:
    return io.BytesIO(struct.pack(">I", len(payload)) + payload)


def test_oversized_answers_are_caught_on_the_host() -> None:
    """The worker's own payload limit runs in the sandbox, where a grader can patch it out."""
    big = {
        "ok": True,
        "value": {"scores": {"s": 1.0}, "judge": "x" * (limits.RESULT_PAYLOAD_BYTES + 10)},
        "ms": 1.0,
    }
    small = {"ok": True, "value": 0.5, "ms": 1.0}
    frame = {"t": "results", "b": "tok", "start": 0, "answers": [small, big, small]}
    decoded = read_frame(_frame(json.dumps(frame).encode()))
    first, second, third = (from_answer(i, a) for i, a in enumerate(decoded["answers"]))
    assert (first.status, third.status) == ("returned", "returned")
    assert second.status == "oversized"
    assert second.error is not None
    assert "limit is 1000000 bytes" in second.error["message"]
    assert len(second.value or "") <= limits.INVALID_PAYLOAD_REPR_CHARS + 3


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_frame_or_a_frame_error(payload: bytes) -> None:
    with contextlib.suppress(FrameError):
        read_frame(_frame(payload))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["t", "b", "start", "answers", "i", "n"]), values, max_size=6)
)
def test_any_frame_is_answers_or_a_verdict(frame: dict[str, Any]) -> None:
    batch = _Batch("grader", [(i, [i], None) for i in range(3)], os.urandom(8).hex())
    if "b" in frame:
        frame["b"] = batch.token  # the hard case: a frame that passes the token check
    outcome = GraderSandbox._accept(batch, frame)
    assert isinstance(outcome, list | str)
    if isinstance(outcome, list):
        assert [position for position, _ in outcome] == list(range(len(outcome)))
        assert batch.answered == len(outcome) <= 3
