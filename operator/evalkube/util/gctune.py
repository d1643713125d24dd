"""Garbage-collector settings for the hot paths: grading units and proxying model calls.

A unit allocates millions of short-lived acyclic objects (dicts, records); CPython's default
generation-0 threshold (700) then runs collections that scan the unit's live buffers again
and again: measured at ~16 µs per sample, over a third of the host's cost. The proxy's
requests do the same on a smaller scale (3% of its instructions per call went to the
collector). Raising the thresholds keeps collections rare without disabling them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

HOT_PATH_THRESHOLDS = (100_000, 50, 100)


@contextmanager
def relaxed_gc() -> Iterator[None]:
    """Raise the collector's thresholds for the block; restore them after."""
    previous = gc.get_threshold()
    gc.set_threshold(*HOT_PATH_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
