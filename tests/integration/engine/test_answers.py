"""AnswerLog on a real SQLite store: answers committed as they arrive, read back on resume."""

from __future__ import annotations

from pathlib import Path

from evalkube.engine.answers import AnswerLog
from evalkube.engine.candidates import Candidate
from evalkube.store import ResultStore


def test_answers_are_committed_by_flush_and_read_back_by_another_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = ResultStore.open(url)
    log = AnswerLog(store, "run-1")
    paid = Candidate(
        output_text="four", response_id="resp_1", ms=12.5, model_calls={"candidate": 1}
    )
    failed = Candidate(error="HTTP 500", model_calls={"candidate": 1})
    free = Candidate(output_text="precomputed")  # no call: nothing to keep
    log.add("s1", paid)
    log.add("s2", failed)
    log.add("s3", free)
    log.flush()
    other = ResultStore.open(url)  # what a resumed process sees
    try:
        kept = AnswerLog(other, "run-1")
        found = kept.kept(["s1", "s2", "s3", "s4"])
        assert found == {"s1": paid}
        another_run = AnswerLog(other, "run-2")
        assert another_run.kept(["s1"]) == {}
        another_run.close()
        kept.close()
        other.forget_answers("run-1")
        assert log.kept(["s1"]) == {}
    finally:
        log.close()
        other.close()
        store.close()


def test_grader_calls_replay_in_order_until_the_grader_asks_something_else(
    tmp_path: Path,
) -> None:
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    first = AnswerLog(store, "run-1")
    first.label({"tok-a": "s1"}, resuming=False)
    first.keep("tok-a", "responses", {"model": "j", "input": "one"}, b'{"id": "resp_1"}')
    first.keep("tok-a", "responses", {"model": "j", "input": "two"}, b'{"id": "resp_2"}')
    first.close()  # the run stops here; its answers are committed

    resumed = AnswerLog(store, "run-1")
    resumed.label({"tok-b": "s1"}, resuming=True)  # a fresh token for the same sample
    assert resumed.replay("tok-b", "responses", {"input": "one", "model": "j"}) == (
        b'{"id": "resp_1"}'
    )
    # the second request differs: call the provider, and forget the stale answer
    assert resumed.replay("tok-b", "responses", {"model": "j", "input": "other"}) is None
    resumed.keep("tok-b", "responses", {"model": "j", "input": "other"}, b'{"id": "resp_3"}')
    assert resumed.replay("tok-x", "responses", {"model": "j", "input": "one"}) is None
    resumed.close()
    kept = store.recorded_answers("run-1", "ctx", ["s1"])["s1"]
    assert [call["answer"] for call in kept] == ['{"id": "resp_1"}', '{"id": "resp_3"}']
    store.close()
