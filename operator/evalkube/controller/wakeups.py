"""Wake-ups of kopf daemons: an event per object whose daemon is running, set to ask it for a
pass now instead of after its sleep. Runs and schedules both drive themselves this way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

Key = tuple[str, str]


class Wakeups:
    """``(namespace, name) -> event`` of each object whose daemon is in :meth:`held`."""

    def __init__(self) -> None:
        self._events: dict[Key, asyncio.Event] = {}

    @contextlib.contextmanager
    def held(self, key: Key) -> Iterator[asyncio.Event]:
        """The daemon's event while it runs (a newer daemon of the same object takes over)."""
        event = self._events[key] = asyncio.Event()
        try:
            yield event
        finally:
            if self._events.get(key) is event:
                del self._events[key]

    def __contains__(self, key: object) -> bool:
        """Whether the object's daemon is running."""
        return key in self._events

    def wake(self, key: Key) -> None:
        """Ask for a pass; a pass in progress is followed by one more (wakes coalesce)."""
        if (event := self._events.get(key)) is not None:
            event.set()


async def sleep(event: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds`` or until ``event`` is set, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
