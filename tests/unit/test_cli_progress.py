"""`evalkube run`'s progress bars: model answers and graded samples are counted apart."""

from __future__ import annotations

from rich.progress import Progress

from evalkube.cli.run_output import RichProgress
from evalkube.engine import Unit


def bars(progress: Progress) -> dict[str, tuple[float, float | None]]:
    return {task.description: (task.completed, task.total) for task in progress.tasks}


def test_generated_models_get_a_generate_bar_apart_from_the_grade_bar() -> None:
    progress = Progress(disable=True)
    drawn = RichProgress(progress)
    shards = [Unit(f"u{i}", "qa", "openai:m", "shard", i, i * 10, i * 10 + 10) for i in range(2)]
    free = Unit("p0", "qa", "precomputed", "shard", 0, 0, 10)
    drawn.planned([*shards, free])
    drawn.unit_started(shards[0], 10)
    drawn.generated(shards[0], 7)  # answers arrived, nothing graded yet
    assert bars(progress) == {
        "qa · openai:m · generate": (7, 20),
        "qa · openai:m · grade": (0, 20),
        "qa · precomputed": (0, 10),
    }
    drawn.generated(shards[0], 3)
    drawn.advance(shards[0], 10)
    drawn.advance(free, 10)
    assert bars(progress) == {
        "qa · openai:m · generate": (10, 20),
        "qa · openai:m · grade": (10, 20),
        "qa · precomputed": (10, 10),
    }
