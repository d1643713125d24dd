"""Write samples on a background thread while the unit keeps grading.

The database driver releases the GIL while it executes, so moving the inserts off the
runner's thread lets the store, the runner and the grader worker overlap. Rows are encoded
on the caller's thread; at most ``depth`` chunks wait, so memory stays bounded. ``flush``
returns only when everything submitted is committed, and re-raises any write error: a
unit counts as done only after its samples are stored.

A local run shares one writer across its units and queues "mark the unit done" behind the
unit's samples (:meth:`SampleWriter.then`): the next unit starts grading while the last
chunks of the previous one are committed, instead of every unit ending in a pause.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from evalkube.store.protocol import SampleStore
from evalkube.store.records import SampleRecord


class SampleWriter:
    """A bounded, ordered, background sample writer for one unit."""

    def __init__(self, store: SampleStore, depth: int = 2) -> None:
        self._store = store
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="evalkube-sample-writer", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    if callable(item):
                        item()
                    else:
                        self._store.write_encoded(item)
            except BaseException as exc:  # surfaced to the runner by flush()/submit()
                self._error = exc
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, records: Sequence[SampleRecord]) -> None:
        """Queue ``records`` for writing (blocks while ``depth`` chunks are pending)."""
        self._raise()
        self._queue.put(self._store.encode_samples(records))

    def then(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the writer thread once everything submitted so far is committed
        (skipped after a write error, which the next call or :meth:`flush` raises)."""
        self._raise()
        self._queue.put(action)

    def flush(self) -> None:
        """Wait until everything submitted is committed; raise the first write error."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Flush, then stop the thread."""
        try:
            self.flush()
        finally:
            self._queue.put(None)
            self._thread.join(timeout=30)
