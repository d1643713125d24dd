"""What every ``evalkube`` command shares: consoles, the ``--db`` option, errors and exit codes.

It lives in the lowest package of the command layer, so ``reporting``, ``submit`` and ``cli``
import it without importing ``evalkube.cli``, which imports every command to register it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.segment import Segment
from rich.text import Text

from evalkube.store import ResultStore, StoreError

EXIT_CONFIG = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130
DEFAULT_DB = ".evalkube/results.db"

#: C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and
#: isolates (text that reorders what follows it on screen).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: What JSON leaves raw but a terminal may act on: DEL, C1 and the bidirectional controls.
_JSON_RAW = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, line_ends: bool = False) -> str:
    """``text`` with every control character a terminal would act on (escape sequences:
    window title, OSC 52 clipboard writes, screen clears, cursor moves; C1 and bidi
    controls) written as a visible ``\\xNN`` / ``\\uNNNN`` escape; tabs and newlines kept
    (and carriage returns, with ``line_ends``: CSV ends its rows with them)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(
        lambda m: (
            m[0]
            if line_ends and m[0] == "\r"
            else f"\\x{ord(m[0]):02x}"
            if ord(m[0]) < 0x100
            else f"\\u{ord(m[0]):04x}"
        ),
        text,
    )


def json_printable(text: str) -> str:
    """JSON text with DEL, C1 and bidi controls as ``\\u`` escapes (the same JSON value;
    ``json.dumps`` already escapes C0)."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


class SafeConsole(Console):
    """A rich console that never writes untrusted control characters: strings (markup,
    table cells) are escaped before layout, and every text segment again before output, so
    model output, grader text and metric names reach the terminal as text. Rich's own
    control segments (cursor moves of progress bars) and styles are untouched."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                yield Segment(printable(segment.text), segment.style)
            else:
                yield segment


# Piped or captured output has no terminal to fit: keep tables whole rather than at 80 columns.
console = SafeConsole(width=None if sys.stdout.isatty() else 160)
errors = SafeConsole(stderr=True)


def progress_bars(quiet: bool, *counts: ProgressColumn) -> Progress:
    """Bars on stderr (a description, the bar, ``counts``, the time taken), drawn only on a
    terminal and without ``quiet``."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        *counts,
        TimeElapsedColumn(),
        console=errors,
        disable=quiet or not errors.is_terminal,
    )


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="EVALKUBE_DB",
        help=f"Results store URL or SQLite path [default: {DEFAULT_DB}]",
    ),
]

#: ``--api`` and ``--namespace`` of the commands that read a run from the operator's API.
ApiOption = Annotated[
    str | None,
    typer.Option(envvar="EVALKUBE_API", help="Read from the operator's samples API (URL)"),
]
NamespaceOption = Annotated[str, typer.Option("--namespace", "-n", help="With --api")]


def store_url(db: str | None) -> str:
    """The store's URL; a path (the default too) becomes absolute, so messages can name the
    file whatever directory the command ran in."""
    db = db or DEFAULT_DB
    if "://" in db:
        return db
    path = Path(db).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def shown_store(db: str | None) -> str:
    """The store ``--db`` names as a person should read it: the file of a SQLite URL, else the
    URL without its password."""
    from sqlalchemy.engine import make_url

    url = store_url(db)
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///")
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def open_store(db: str | None) -> ResultStore:
    try:
        return ResultStore.open(store_url(db))
    except StoreError as exc:
        fail(str(exc), EXIT_RUNTIME)


def not_in_store(run_id: str, db: str | None) -> NoReturn:
    fail(
        f"run {run_id!r} is not in the store {shown_store(db)}; list its runs with "
        "`evalkube runs` (or pass --db)",
        EXIT_CONFIG,
    )


def fail(message: str, code: int) -> NoReturn:
    # messages quote user input (task ids in brackets, YAML, code): never parse them as markup
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, with lone surrogates (a grader may return them) as ``\\udXXX``
    escapes: valid JSON inside a JSON string, and readable on a terminal."""
    return text.encode("utf-8", "backslashreplace")
