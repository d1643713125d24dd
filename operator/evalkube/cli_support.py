"""What every ``evalkube`` command shares: consoles, the ``--db`` option, errors and exit codes.

A module of its own so command bodies can live in their own modules (``evalkube.reporting``)
without importing ``evalkube.cli``, which imports them to register them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from evalkube.store import ResultStore, StoreError

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130
DEFAULT_DB = ".evalkube/results.db"

# Piped or captured output has no terminal to fit: keep tables whole rather than at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="EVALKUBE_DB",
        help=f"Results store URL or SQLite path [default: {DEFAULT_DB}]",
    ),
]


def store_url(db: str | None) -> str:
    """The store's URL; a path (the default too) becomes absolute, so messages can name the
    file whatever directory the command ran in."""
    db = db or DEFAULT_DB
    if "://" in db:
        return db
    path = Path(db).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def shown_store(url: str) -> str:
    """The store as a person should read it: the file of a SQLite URL, else the URL without
    its password."""
    from sqlalchemy.engine import make_url

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


def fail(message: str, code: int) -> NoReturn:
    # messages quote user input (task ids in brackets, YAML, code): never parse them as markup
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, with lone surrogates (a grader may return them) as ``\\udXXX``
    escapes: valid JSON inside a JSON string, and readable on a terminal."""
    return text.encode("utf-8", "backslashreplace")
