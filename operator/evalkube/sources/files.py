"""Reading local files that may be hostile: regular files only, lines of bounded length.

A path may name a FIFO that never ends, a device such as ``/dev/zero`` or a line of a
gigabyte; these readers refuse them with a :class:`~evalkube.models.ConfigError` that names the
field, before reading more than a documented number of bytes (:mod:`evalkube.limits`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from evalkube import limits
from evalkube.models import ConfigError

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def open_regular(path: Path, where: str) -> IO[bytes]:
    """``path`` opened for reading in binary mode, refused unless it is a regular file.

    The file is opened non-blocking and checked on its descriptor (``fstat``), so neither a
    FIFO without a writer hangs the open nor a path swapped after a check is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        at = f"{path}: cannot read:" if where == str(path) else f"{where}: cannot read {path}"
        raise ConfigError(f"{at} ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise ConfigError(f"{named(where, path)}: is {kind}; give a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def named(where: str, path: str | Path) -> str:
    """``field: path`` (just the path when the field is the path)."""
    return str(path) if where == str(path) else f"{where}: {path}"


def bounded_lines(
    handle: IO[bytes], where: str, path: str | Path, max_bytes: int = limits.DATASET_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a binary file; a line longer than ``max_bytes`` is refused
    after reading ``max_bytes`` of it, never the whole line."""
    number = 0
    while True:
        line = handle.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_bytes:
            raise ConfigError(
                f"{named(where, path)} line {number}: longer than {max_bytes:,} bytes; "
                "a row must fit in one line of at most that size"
            )
        yield number, line
