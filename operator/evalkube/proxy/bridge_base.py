"""What both local bridges share: the in-process :class:`~evalkube.proxy.bridge.ModelBridge`
and the child-process :class:`~evalkube.proxy.native.NativeBridge`.

Kept free of aiohttp so the native side imports it without the Python server.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Self

#: Seconds to wait for a bridge to start, answer a control call, or stop.
CONTROL_TIMEOUT = 30.0
SOCKET_NAME = "model.sock"


def grader_listen(socket_path: str | None, private_dir: str) -> str:
    """The grader listener for ``start(socket_path)``: ``None`` -> a unix socket in
    ``private_dir``; ``unix:/p``, ``http://h:p`` or ``host:port`` as given; a bare path -> a
    unix socket there."""
    if socket_path is None:
        return f"unix:{Path(private_dir) / SOCKET_NAME}"
    return socket_path if ":" in socket_path else f"unix:{socket_path}"


class BridgeLifecycle(ABC):
    """``start``/``stop`` plus ``close`` and the context manager on top of them."""

    @property
    @abstractmethod
    def started(self) -> bool: ...

    @abstractmethod
    def start(self, socket_path: str | None = None) -> str: ...

    @abstractmethod
    def stop(self) -> None: ...

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        if not self.started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
