"""The one schedule the runner's control and candidate calls wait by while the proxy sidecar
restarts: 0.1 s doubling to 2 s, never past its window."""

from __future__ import annotations

import itertools

from evalkube.proxy.control import restart_pauses


def test_pauses_double_to_two_seconds_and_stay_inside_the_window() -> None:
    pauses = list(itertools.islice(restart_pauses(60), 8))
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    # each pause must end inside the window (here no time passes between them)
    assert list(restart_pauses(1.0)) == [0.1, 0.2, 0.4, 0.8]


def test_no_window_no_pause() -> None:
    """A child process nobody restarts (``restart_retry_seconds=0``): the first failure is
    final."""
    assert list(restart_pauses(0)) == []
