"""Bring a results store's tables to the shape this evalkube writes, or refuse it clearly.

Alembic does the work: the revisions in ``migrations/versions`` are the history of
:mod:`evalkube.store.schema`, and the store's ``evalkube_alembic_version`` table says which
of them it has. An up-to-date store costs one read of that table. Anything else (a new
database, an older store, a store written before migrations existed) is handled under a
lock (SQLite's write lock, a PostgreSQL advisory lock) inside one transaction, so operator
replicas and parallel workers opening the same new store at once wait for the first instead
of creating the same tables twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from evalkube.store import schema
from evalkube.store.errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config

#: Alembic's version table, prefixed like the store's tables: a PostgreSQL database shared
#: with another application that uses Alembic keeps the two histories apart.
VERSION_TABLE = "evalkube_alembic_version"
_SCRIPTS = Path(__file__).with_name("migrations")
#: The tables the last evalkube before migrations created on open (revision 0001 creates
#: them); a store from then may lack the later ones, which that evalkube would have added.
#: They are created in their current shape, so a later revision that changes one of them
#: must be recognisable from the columns it leaves, as those of ``schema.ADDED_COLUMNS`` are.
_PRE_MIGRATION_TABLES = (
    schema.runs,
    schema.units,
    schema.samples,
    schema.task_results,
    schema.answers,
)
#: Any 64-bit number no other user of advisory locks on the database picks: "evalkube".
_PG_LOCK_KEY = int.from_bytes(b"evalkube", "big") & 0x7FFF_FFFF_FFFF_FFFF


def _config(connection: Connection | None = None) -> Config:
    """Alembic's configuration without an alembic.ini: ``migrations/env.py`` reads the
    connection and the version table from ``attributes``.

    Alembic is imported here, not at the top: an up-to-date store never needs it, and it
    would add to the start of every command and worker.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    config.attributes["connection"] = connection
    config.attributes["version_table"] = VERSION_TABLE
    return config


def known_revisions() -> list[str]:
    """The revisions in ``migrations/versions``, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(_config())
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


def upgrade(engine: Engine, shown: str) -> None:
    """Bring the store at ``engine`` (``shown``: its URL for messages) to
    :data:`schema.REVISION`.

    Raises :class:`StoreError` for a store this evalkube must not write (samples layout 1, a
    revision from a newer evalkube) and lets other errors (no such file, no server) through.
    """
    with engine.connect() as conn:
        try:
            current = tuple(
                row[0] for row in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
            )
        except Exception:  # no version table yet: decided below, under the lock
            current = ()
        conn.rollback()
        if current == (schema.REVISION,):
            return
        _lock(conn)
        _upgrade_locked(conn, shown)
        conn.commit()


def _lock(conn: Connection) -> None:
    """Begin the transaction that migrates, holding the database's lock for it."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        # pysqlite begins transactions lazily, and never before DDL; take the write lock now
        # so a second opener waits here (up to the connection's timeout) instead of failing.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def _upgrade_locked(conn: Connection, shown: str) -> None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    head = schema.REVISION
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    current = context.get_current_heads()
    if current == (head,):  # another opener did it while this one waited for the lock
        return
    unknown = sorted(set(current) - set(known_revisions()))
    if unknown:
        raise StoreError(
            f"the results store {shown} was written by a newer evalkube (schema revision "
            f"{', '.join(unknown)}; this version knows up to {head}); upgrade evalkube to "
            "open it, or point --db at a new file or database"
        )
    config = _config(conn)
    if not current:
        stamp = _revision_of_pre_migration_store(conn, shown)
        if stamp is not None:
            command.stamp(config, stamp)
    try:
        command.upgrade(config, head)
    except Exception as exc:
        raise StoreError(
            f"cannot upgrade the results store {shown} to schema revision {head}: {exc}"
        ) from None


def _revision_of_pre_migration_store(conn: Connection, shown: str) -> str | None:
    """The revision matching a store written before migrations (``None``: a new database).

    Such a store is completed the way the evalkube that wrote it would have on open (missing
    tables created); the added columns it has then say which revision it is at.
    """
    inspector = inspect(conn)
    tables = set(inspector.get_table_names())
    if not tables & {t.name for t in _PRE_MIGRATION_TABLES}:
        return None
    if schema.samples.name in tables:
        columns = {c["name"] for c in inspector.get_columns(schema.samples.name)}
        if "detail" not in columns:
            raise StoreError(
                f"the results store {shown} was written by an earlier evalkube (samples "
                f"layout 1; this version writes layout {schema.SAMPLES_LAYOUT}); point --db "
                "at a new file or database, or read it with the evalkube that wrote it"
            )
    schema.metadata.create_all(conn, tables=list(_PRE_MIGRATION_TABLES))
    inspector = inspect(conn)
    revision = "0001"
    for added_in, table, column in schema.ADDED_COLUMNS:
        if column not in {c["name"] for c in inspector.get_columns(table)}:
            break
        revision = added_in
    return revision
