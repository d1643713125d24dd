"""Opening the results store (its URL, SQLite's pragmas, the tables upgraded to this
evalkube's by :mod:`evalkube.store.migrate`) and the connection helpers its parts share."""

from __future__ import annotations

import sqlite3
from collections.abc import Generator
from pathlib import Path
from typing import Any, Self

import tenacity
from sqlalchemy import Engine, Executable, create_engine, event
from sqlalchemy.engine import make_url

from evalkube.store import migrate
from evalkube.store.errors import StoreError
from evalkube.util import jsonfast

#: Seconds a new SQLite connection keeps trying to switch the file to WAL (its busy timeout).
SQLITE_LOCK_SECONDS = 30


def default_url(path: str) -> str:
    """SQLite URL for a file path."""
    return f"sqlite:///{path}"


def load_json(text: str | None) -> Any:
    """A JSON column's value (``None`` stays ``None``)."""
    return None if text is None else jsonfast.loads(text)


class Database:
    """The store's SQLAlchemy engine: opening, closing, and one statement at a time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name

    @classmethod
    def open(cls, url: str) -> Self:
        """Open the store at ``url``, creating its tables or upgrading them to this evalkube's
        (:mod:`evalkube.store.migrate`)."""
        try:
            parsed = make_url(url)
        except Exception as exc:
            raise StoreError(f"invalid store URL {url!r}: {exc}") from None
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        on_sqlite = parsed.get_backend_name() == "sqlite"
        engine = create_engine(
            parsed, connect_args={"timeout": SQLITE_LOCK_SECONDS} if on_sqlite else {}
        )
        if on_sqlite:
            event.listen(engine, "connect", _sqlite_pragmas)
        shown = parsed.render_as_string(hide_password=True)
        try:
            migrate.upgrade(engine, shown)
        except StoreError:
            engine.dispose()
            raise
        except Exception as exc:
            engine.dispose()
            raise StoreError(f"cannot open the results store {shown}: {exc}") from None
        return cls(engine)

    @property
    def location(self) -> str:
        """The store's URL without its password (a SQLite store: its file), for messages."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database:
            return str(Path(url.database).resolve())
        return url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _fetch(self, query: Executable) -> list[Any]:
        """Every row of a read."""
        with self.engine.connect() as conn:
            return list(conn.execute(query))

    def _stream(self, query: Executable, fetched: int = 5000) -> Generator[Any, None, None]:
        """The rows of a read, ``fetched`` at a time from the database; a reader that stops
        early (a page full) closes the server's cursor."""
        with self.engine.connect() as conn:
            result = conn.execution_options(yield_per=fetched).execute(query)
            try:
                yield from result
            finally:
                result.close()

    def _write(self, statement: Executable, rows: list[dict[str, Any]] | None = None) -> Any:
        """Run one statement (over ``rows``) in a transaction of its own; its result."""
        with self.engine.begin() as conn:
            return conn.execute(statement, rows)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Switching a new file to WAL needs it to itself, and SQLite answers "database is locked"
    # at once, without its busy timeout, while another connection opening the same new store
    # holds it: try again until that one is done (then the file is in WAL and this is a read).
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(
            lambda exc: isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        ),
        wait=tenacity.wait_random(0.01, 0.05),
        stop=tenacity.stop_after_delay(SQLITE_LOCK_SECONDS),
        reraise=True,
    ):
        with attempt:
            cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
