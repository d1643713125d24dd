"""The HTML report's page is bounded: each field of a sample is cut at
``limits.REPORT_FIELD_CHARS`` with a pointer to ``evalkube samples``, and samples stop once
``limits.REPORT_SAMPLES_BYTES`` of their text is on the page."""

from __future__ import annotations

from collections.abc import Iterator

from evalkube import limits
from evalkube.reporting.report import SCORES_SHOWN, bounded_view, histograms


def test_every_field_is_cut_with_a_pointer() -> None:
    huge = "x" * (limits.REPORT_FIELD_CHARS * 50)
    view = {
        "sample_id": "s1",
        "prompt": huge,
        "output_text": huge,
        "judge": {"blob": huge},
        "error": {"type": "E", "message": huge, "traceback": huge},
        "stdout": huge,
        "scores": {f"m{i}": 1.0 for i in range(SCORES_SHOWN * 3)},
    }
    shown, size = bounded_view(view, "run-1")
    for key in ("prompt", "output_text", "judge", "stdout"):
        assert len(shown[key]) < limits.REPORT_FIELD_CHARS + 200, key
        assert shown[key].endswith("the whole field: evalkube samples run-1 --format jsonl")
    assert len(shown["error"]["message"]) < limits.REPORT_FIELD_CHARS + 200
    assert len(shown["scores"]) == SCORES_SHOWN
    assert "100 more scores" in shown["scores_more"]
    assert size < 10 * (limits.REPORT_FIELD_CHARS + 200)


def test_small_fields_are_kept_whole() -> None:
    shown, _ = bounded_view(
        {"sample_id": "s", "output_text": "4", "judge": None, "scores": {}}, "r"
    )
    assert shown["output_text"] == "4"
    assert shown["judge"] is None


def test_distributions_stop_at_their_cap_and_say_so() -> None:
    """Graders choose metric names (up to 64 new ones per sample): 10,000 samples of fresh
    names draw at most ``REPORT_HISTOGRAMS_MAX`` SVGs, and the page says others exist."""

    def scores() -> Iterator[tuple[str, str, str, dict[str, float]]]:
        for i in range(10_000):
            yield "t", "m", "graded", {"score": 1.0, **{f"n{i}_{j}": 0.5 for j in range(64)}}

    drawn, left_out = histograms(scores)
    assert len(drawn) == limits.REPORT_HISTOGRAMS_MAX
    assert left_out
    score = next(h for h in drawn if h.metric == "score")
    assert score.total == 10_000  # a metric that is drawn counts every sample
    few, none_left = histograms(lambda: iter([("t", "m", "graded", {"score": 1.0})]))
    assert [h.metric for h in few] == ["score"]
    assert not none_left
