"""The worker loop, driven in-process and as a real process: load, run, capture, answer."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import evalkube_sandbox
from evalkube_sandbox import PROTOCOL_VERSION
from evalkube_sandbox.capture import CappedText
from evalkube_sandbox.errors import describe
from evalkube_sandbox.protocol import encode, read_frame
from evalkube_sandbox.worker import Worker

WORKER_ROOT = Path(evalkube_sandbox.__file__).resolve().parent.parent


def program(source: str, entrypoint: str = "grade", name: str = "grader") -> dict[str, Any]:
    return {
        "name": name,
        "source": source,
        "filename": f"/graders/{name}.py",
        "entrypoint": entrypoint,
    }


def load_request(*programs: dict[str, Any], capture_chars: int = 8_192) -> dict[str, Any]:
    return {
        "op": "load",
        "task_id": "t",
        "programs": list(programs),
        "capture_chars": capture_chars,
    }


def run_request(items: list[list[Any]], batch: int = 1, name: str = "grader") -> dict[str, Any]:
    return {"op": "run", "program": name, "items": items, "batch": batch}


def serve(*requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Run a Worker over ``requests`` in this process; return every frame it wrote."""
    stream = io.BytesIO(b"".join(encode(r) for r in requests))
    with tempfile.TemporaryFile() as answers:
        assert Worker(stream, answers.fileno()).serve() == 0
        answers.seek(0)
        frames = []
        while (frame := read_frame(answers)) is not None:
            frames.append(frame)
    return frames


def answers_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for frame in frames:
        if frame.get("t") == "results":
            assert frame["start"] == len(out)
            out.extend(frame["answers"])
    return out


def grade_all(source: str, items: list[list[Any]], **load: Any) -> list[dict[str, Any]]:
    frames = serve(load_request(program(source), **load), run_request(items))
    assert frames[0]["t"] == "hello"
    assert frames[1]["t"] == "loaded"
    assert frames[-1] == {"t": "done", "b": 1, "n": len(items)}
    return answers_of(frames)


# -- the conversation ---------------------------------------------------------------------------


def test_hello_loaded_results_done() -> None:
    frames = serve(
        load_request(program("def grade(sample, item):\n    return sample['x'] * 2\n")),
        run_request([[{"x": 1}, {}], [{"x": 2}, {}]], batch=41),
    )
    assert frames[0]["t"] == "hello"
    assert frames[0]["protocol"] == PROTOCOL_VERSION
    assert frames[0]["pid"] == os.getpid()
    assert frames[1] == {"t": "loaded", "programs": {"grader": {"ctx": False}}, "zygote": False}
    assert all(f["b"] == 41 for f in frames[2:])
    answers = answers_of(frames)
    assert [(a["ok"], a["value"]) for a in answers] == [(True, 2), (True, 4)]
    assert all(isinstance(a["ms"], float | int) and a["ms"] >= 0 for a in answers)
    assert frames[-1] == {"t": "done", "b": 41, "n": 2}


def test_loaded_reports_ctx_per_program() -> None:
    frames = serve(
        load_request(
            program("def grade(sample, item, ctx):\n    return 1\n"),
            program("def transform(row):\n    return row\n", "transform", "preprocess"),
        )
    )
    assert frames[1]["programs"] == {"grader": {"ctx": True}, "preprocess": {"ctx": False}}


def test_ctx_is_passed_only_when_asked_for() -> None:
    source = (
        "def grade(sample, item, ctx):\n"
        "    return {'scores': {'x': 1}, 'judge': [type(ctx).__name__, ctx.execution_id,"
        " ctx.task_id]}\n"
    )
    frames = serve(
        load_request(program(source)),
        {**run_request([[{}, {}], [{}, {}]]), "exec_ids": ["s_1", "s_2"]},
    )
    judges = [a["value"]["judge"] for a in answers_of(frames)]
    assert judges == [["Context", "s_1", "t"], ["Context", "s_2", "t"]]


def test_default_parameter_is_left_to_the_user() -> None:
    source = "def grade(sample, item, weights=[0.25, 0.75]):\n    return sum(weights)\n"
    (answer,) = grade_all(source, [[{}, {}]])
    assert answer == {"ok": True, "value": 1.0, "ms": answer["ms"]}


def test_model_calls_without_access_raise_in_the_grader() -> None:
    source = "def grade(sample, item, ctx):\n    return ctx.responses_create(input='hi')\n"
    (answer,) = grade_all(source, [[{}, {}]])
    assert answer["ok"] is False
    assert answer["error"]["type"] == "ModelCallError"
    assert "model access is disabled" in answer["error"]["message"]


def test_exceptions_are_answers_with_type_message_and_traceback() -> None:
    source = (
        "def grade(sample, item):\n"
        "    if sample['x']:\n"
        "        raise ValueError('bad x')\n"
        "    return 1\n"
    )
    ok, failed = grade_all(source, [[{"x": 0}, {}], [{"x": 1}, {}]])
    assert ok["ok"] is True
    assert failed["ok"] is False
    assert failed["error"]["type"] == "ValueError"
    assert failed["error"]["message"] == "bad x"
    assert 'File "/graders/grader.py", line 3, in grade' in failed["error"]["traceback"]
    assert failed["error"]["traceback"].splitlines()[-1] == "ValueError: bad x"


def test_system_exit_and_keyboard_interrupt_are_caught() -> None:
    source = (
        "import sys\n"
        "def grade(sample, item):\n"
        "    if sample['k'] == 'exit':\n"
        "        sys.exit(1)\n"
        "    raise KeyboardInterrupt\n"
    )
    exited, interrupted = grade_all(source, [[{"k": "exit"}, {}], [{"k": "int"}, {}]])
    assert exited["error"]["type"] == "SystemExit"
    assert interrupted["error"]["type"] == "KeyboardInterrupt"


def test_wrong_arity_is_an_execution_error_not_a_crash() -> None:
    (answer,) = grade_all("def grade(sample):\n    return 1\n", [[{}, {}]])
    assert answer["error"]["type"] == "TypeError"


def test_non_finite_return_values_travel_to_the_host() -> None:
    source = "def grade(sample, item):\n    return float(sample['v'])\n"
    answers = grade_all(source, [[{"v": "nan"}, {}], [{"v": "inf"}, {}], [{"v": "-inf"}, {}]])
    values = [a["value"] for a in answers]
    assert values[0] != values[0]
    assert values[1:] == [float("inf"), float("-inf")]


def test_unserializable_value_is_reported_with_its_repr() -> None:
    source = (
        "class Odd:\n"
        "    def __repr__(self):\n"
        "        return '<Odd>'\n"
        "def grade(s, i):\n"
        "    return Odd()\n"
    )
    (answer,) = grade_all(source, [[{}, {}]])
    assert "value" not in answer
    assert answer["unserializable"]["type"] == "Odd"
    assert answer["unserializable"]["repr"] == "<Odd>"


def test_oversized_value_is_reported_not_sent() -> None:
    frames = serve(
        {
            **load_request(program("def grade(s, i):\n    return 'x' * 5000\n")),
            "payload_bytes": 1000,
        },
        run_request([[{}, {}]]),
    )
    (answer,) = answers_of(frames)
    assert "value" not in answer
    assert answer["oversized"]["limit"] == 1000
    assert answer["oversized"]["bytes"] > 5000


def test_state_persists_between_executions_of_a_batch() -> None:
    source = "SEEN = []\ndef grade(s, i):\n    SEEN.append(1)\n    return len(SEEN)\n"
    answers = grade_all(source, [[{}, {}]] * 3)
    assert [a["value"] for a in answers] == [1, 2, 3]


def test_many_items_are_answered_in_order_across_flushes() -> None:
    answers = grade_all(
        "def grade(s, i):\n    return s['n']\n", [[{"n": n}, {}] for n in range(1000)]
    )
    assert [a["value"] for a in answers] == list(range(1000))


# -- load errors --------------------------------------------------------------------------------


def test_load_error_frame_names_the_program() -> None:
    frames = serve(load_request(program("def grade(:\n")))
    assert frames[1]["t"] == "load_error"
    assert frames[1]["name"] == "grader"
    assert frames[1]["error"]["type"] == "SyntaxError"
    assert frames[1]["error"]["line"] == 1


def test_missing_function_frame() -> None:
    frames = serve(load_request(program("x = 1\n", "transform_batch", "preprocess")))
    assert frames[1]["t"] == "load_error"
    assert frames[1]["error"]["type"] == "MissingFunction"
    assert "transform_batch" in frames[1]["error"]["message"]


def test_unknown_op_is_answered_with_an_error() -> None:
    frames = serve({"op": "dance"}, {"op": "ping"})
    assert frames[1] == {
        "t": "error",
        "error": {"type": "ProtocolError", "message": "unknown op 'dance'"},
    }
    assert frames[2] == {"t": "pong"}


# -- print capture ------------------------------------------------------------------------------


def test_prints_are_captured_per_execution() -> None:
    source = (
        "import sys\n"
        "def grade(sample, item):\n"
        "    print('out', sample['n'])\n"
        "    print('err', sample['n'], file=sys.stderr)\n"
        "    return 1\n"
    )
    answers = grade_all(source, [[{"n": 1}, {}], [{"n": 2}, {}]])
    assert [(a["stdout"], a["stderr"]) for a in answers] == [
        ("out 1\n", "err 1\n"),
        ("out 2\n", "err 2\n"),
    ]


def test_quiet_executions_have_no_output_fields() -> None:
    (answer,) = grade_all("def grade(s, i):\n    return 1\n", [[{}, {}]])
    assert "stdout" not in answer
    assert "stderr" not in answer


def test_print_capture_is_capped() -> None:
    source = "def grade(s, i):\n    print('x' * 1000)\n    return 1\n"
    (answer,) = grade_all(source, [[{}, {}]], capture_chars=100)
    assert answer["stdout"] == "x" * 100 + "\n[evalkube: 901 more characters dropped]"


def test_print_capture_is_capped_across_many_writes() -> None:
    source = (
        "def grade(s, i):\n    for _ in range(10_000):\n        print('ab', end='')\n    return 1\n"
    )
    (answer,) = grade_all(source, [[{}, {}]], capture_chars=10)
    assert answer["stdout"] == "ababababab\n[evalkube: 19990 more characters dropped]"


def test_capped_text() -> None:
    text = CappedText(5)
    assert text.text() is None
    assert text.write("abc") == 3
    assert text.write("defg") == 4
    assert text.write("hij") == 3
    assert text.text() == "abcde\n[evalkube: 5 more characters dropped]"
    text.reset()
    assert text.text() is None
    text.write("")
    assert text.text() is None
    with pytest.raises(TypeError):
        text.write(b"bytes")  # type: ignore[arg-type]


def test_describe_keeps_the_traceback_tail() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise RuntimeError("deep " * 1000)
        recurse(n - 1)

    try:
        recurse(50)
    except RuntimeError as exc:
        info = describe(exc)
    assert info["type"] == "RuntimeError"
    assert len(info["message"]) == 2_000
    lines = info["traceback"].splitlines()
    assert len(lines) == 12
    assert lines[-1].startswith("RuntimeError: deep")


def test_describe_survives_a_hostile_str() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    assert describe(Hostile())["message"] == "<unprintable exception>"


# -- as a real process: the protocol channel is private ----------------------------------------


@pytest.mark.timeout(60)
def test_user_output_never_reaches_the_protocol_channel() -> None:
    source = (
        "import os, sys\n"
        "print('import-time noise')\n"
        "def grade(sample, item):\n"
        "    print('hello from print')\n"
        "    sys.__stdout__.write('\\x00\\x00\\x00\\x05junk!')\n"
        "    sys.__stdout__.flush()\n"
        "    os.write(1, b'\\x00\\x00\\x00\\x02{}raw fd 1')\n"
        "    os.write(2, b'raw fd 2')\n"
        "    return 0.5\n"
    )
    bootstrap = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from evalkube_sandbox.worker import main; raise SystemExit(main())"
    )
    requests = encode(load_request(program(source))) + encode(run_request([[{}, {}], [{}, {}]]))
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", bootstrap, str(WORKER_ROOT)],
        input=requests,
        capture_output=True,
        timeout=50,
        check=True,
    )
    stream = io.BytesIO(done.stdout)
    frames = []
    while (frame := read_frame(stream)) is not None:
        frames.append(frame)
    assert [f["t"] for f in frames][:2] == ["hello", "loaded"]
    assert frames[-1]["t"] == "done"
    answers = answers_of(frames)
    assert [a["value"] for a in answers] == [0.5, 0.5]
    assert all(a["stdout"] == "hello from print\n" for a in answers)
    # whatever bypassed print went to stderr, which the host drains separately
    assert b"import-time noise" in done.stderr
    assert b"raw fd 1" in done.stderr
    assert b"raw fd 2" in done.stderr
    assert b"junk!" in done.stderr


# -- durations where the clock is expensive -------------------------------------------------------


def test_expensive_clock_fast_answers_share_their_group_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under gVisor's ptrace platform a clock read is a trapped syscall: the worker stops
    # timing fast executions one by one and gives each the mean of its flush group.
    monkeypatch.setattr("evalkube_sandbox.worker._clock_cost", lambda: 1.0)
    answers = grade_all(
        "def grade(s, i):\n    return s['n']\n", [[{"n": n}, {}] for n in range(600)]
    )
    assert [a["value"] for a in answers] == list(range(600))
    assert all(isinstance(a["ms"], float) and a["ms"] >= 0 for a in answers)
    assert len({a["ms"] for a in answers[:256]}) == 1  # one flush group, one mean


def test_expensive_clock_slow_execution_is_still_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("evalkube_sandbox.worker._clock_cost", lambda: 1.0)
    source = "import time\ndef grade(s, i):\n    time.sleep(s['sleep'])\n    return 1\n"
    items = [[{"sleep": 0}, {}]] * 3 + [[{"sleep": 0.3}, {}]] + [[{"sleep": 0}, {}]] * 3
    frames = serve(load_request(program(source)), run_request(items))
    running = [f for f in frames if f.get("t") == "running"]
    assert [f["i"] for f in running] == [3]
    answers = answers_of(frames)
    # Counted from the heartbeat tick that first saw it: at most one tick (20 ms) short.
    assert answers[3]["ms"] >= 250
    assert max(a["ms"] for i, a in enumerate(answers) if i != 3) < answers[3]["ms"]


def test_lone_surrogates_in_results_are_escaped_not_fatal() -> None:
    answers = grade_all(
        "def grade(s, i):\n    return {'score': 1.0, 'judge': '\\ud800x'}\n", [[{}, {}]] * 2
    )
    assert [a["value"] for a in answers] == [{"score": 1.0, "judge": "\ud800x"}] * 2
