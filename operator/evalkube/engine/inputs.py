"""Reading files a user names (suites, runs, graders, datasets, exports) within bounds.

These files are hostile input (DESIGN.md §5): a path may name a FIFO that never ends, a
device such as ``/dev/zero``, a line of a gigabyte, or a YAML alias bomb of a few hundred
bytes that expands to gigabytes once something walks it. Every reader here opens regular
files only, reads at most a documented number of bytes (:mod:`evalkube.limits`), and turns
every failure, ``MemoryError`` and ``RecursionError`` included, into a
:class:`~evalkube.models.ConfigError` that names the field and says what to do. They are
defined in :mod:`evalkube.sources.files`, where the proxy can reach them too.
"""

from __future__ import annotations

from evalkube.sources.files import (
    bounded_lines,
    open_regular,
    read_bounded,
    read_text,
    yaml_documents,
)

__all__ = ["bounded_lines", "open_regular", "read_bounded", "read_text", "yaml_documents"]
