"""A unit session closes what it opened in one order, whatever ends it (the answers that
arrived are kept even when a close before theirs fails, or Ctrl-C or SIGTERM ends the run)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from evalkube.engine import session as session_module
from evalkube.engine.session import UnitSession


def _open(
    monkeypatch: pytest.MonkeyPatch, closed: list[str], fail: set[str], **kwargs: Any
) -> UnitSession:
    def fake(name: str) -> type:
        class Fake:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.kwargs = kwargs

            def close(self) -> None:
                closed.append(name)
                if name in fail:
                    raise RuntimeError(name)

        return Fake

    for attribute, name in [
        ("SampleWriter", "writer"),
        ("AnswerLog", "answers"),
        ("TaskModelSandboxes", "sandboxes"),
    ]:
        monkeypatch.setattr(session_module, attribute, fake(name))
    return UnitSession("run-1", None, None, None, None, {}, resuming=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("ending", [None, KeyboardInterrupt, RuntimeError])
def test_sandboxes_then_answers_then_samples_then_the_bridge(
    monkeypatch: pytest.MonkeyPatch, ending: type[BaseException] | None
) -> None:
    closed: list[str] = []
    session = _open(monkeypatch, closed, set(), close_bridge=lambda: closed.append("bridge"))
    with pytest.raises(ending) if ending else contextlib.nullcontext(), session:
        if ending:
            raise ending()
    assert closed == ["sandboxes", "answers", "writer", "bridge"]


def test_a_close_that_fails_skips_none_of_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []
    session = _open(monkeypatch, closed, {"sandboxes", "answers"}, close_bridge=lambda: None)
    with pytest.raises(RuntimeError, match="answers"), session:
        pass
    assert closed == ["sandboxes", "answers", "writer"]


def test_a_pod_waits_for_its_own_samples_and_leaves_grader_calls_to_the_sidecar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[str] = []
    with _open(monkeypatch, closed, set(), pod=True) as session:
        assert session.writer is None
        assert session.answers.kwargs == {"grader_calls": False}  # type: ignore[attr-defined]
    assert closed == ["sandboxes", "answers"]
