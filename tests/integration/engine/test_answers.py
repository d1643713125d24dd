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
