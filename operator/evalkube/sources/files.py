"""Reading local files that may be hostile: regular files only, lines of bounded length,
YAML within an alias budget.

A path may name a FIFO that never ends, a device such as ``/dev/zero``, a line of a
gigabyte, or a YAML alias bomb of a few hundred bytes that expands to gigabytes once
something walks it; these readers refuse them with a :class:`~evalkube.models.ConfigError`
that names the field, before reading more than a documented number of bytes
(:mod:`evalkube.limits`). ``MemoryError`` and ``RecursionError`` become that error too.
They live here, below the engine, so that the proxy (``--run-spec``) reads with them as well.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml

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
    handle: IO[bytes], where: str, path: str | Path, lines_before: int = 0
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a binary file (read from its position, after
    ``lines_before`` lines); a line longer than :data:`limits.DATASET_LINE_BYTES` is refused
    after reading that much, never the whole line."""
    max_bytes = limits.DATASET_LINE_BYTES
    number = lines_before
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


def read_bounded(path: Path, where: str, max_bytes: int, hint: str = "") -> bytes:
    """The whole of regular file ``path``, refused past ``max_bytes`` (without reading on)."""
    with open_regular(path, where) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ConfigError(
            f"{named(where, path)}: larger than {max_bytes:,} bytes" + (f"; {hint}" if hint else "")
        )
    return data


def read_text(path: Path, where: str, max_bytes: int, hint: str = "") -> str:
    """:func:`read_bounded`, decoded as UTF-8 (an invalid byte names its offset)."""
    data = read_bounded(path, where, max_bytes, hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{named(where, path)}: not UTF-8 text (byte {exc.start})") from None


class _BoundedLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML (libyaml when present: it refuses nesting deeper than 1000 levels) whose
    documents are refused when their aliases expand past :data:`limits.YAML_NODES_MAX`.

    An alias is a reference, so a bomb is small in memory until something walks it (model
    validation, hashing, the store): the expanded size is counted on the node graph before
    any Python object is built.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        return super().construct_document(node)


def _check_expansion(root: yaml.Node) -> None:
    """Weigh ``root`` with every alias expanded (each shared node walked once, its expanded
    weight memoized); a cycle is refused."""
    budget = limits.YAML_NODES_MAX
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = _weight(node) + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > budget:
                break
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise _TooLarge("an alias refers to a node that contains it (a recursive alias)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    if sizes.get(id(root), budget + 1) > budget:
        raise _TooLarge(
            f"its aliases expand to more than {budget:,} nodes (an alias bomb?); "
            "write the data out, or keep rows in a JSONL dataset file"
        )


def _weight(node: yaml.Node) -> int:
    """A node counts one, a scalar one more per :data:`limits.YAML_SCALAR_CHARS_PER_NODE`
    characters (an alias of a long string repeats the string wherever it is expanded)."""
    if isinstance(node, yaml.ScalarNode):
        return 1 + len(node.value) // limits.YAML_SCALAR_CHARS_PER_NODE
    return 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _TooLarge(Exception):
    """A YAML document over the node budget."""


def yaml_documents(path: Path) -> list[Any]:
    """Every YAML document of ``path`` (a regular file of at most
    :data:`limits.SUITE_FILE_BYTES`), within the alias budget; errors name line and column."""
    label = str(path)
    text = read_text(path, label, limits.SUITE_FILE_BYTES, "keep large datasets in JSONL files")
    try:
        return [doc for doc in yaml.load_all(text, Loader=_BoundedLoader) if doc is not None]
    except _TooLarge as exc:
        raise ConfigError(f"{label}: refused: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError(f"{label}: YAML error at {at}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}: YAML error: {exc}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"{label}: YAML nested too deeply or too large to load") from None
