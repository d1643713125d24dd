"""Alembic revisions of the results store's tables (run by :mod:`evalkube.store.migrate`).

``evalkube.store.schema`` declares the tables' current shape; each change to it is also a new
file in ``versions/`` whose ``down_revision`` is the previous head, so a store written by an
earlier evalkube is brought to that shape on open and the history says what changed when
(``tests/integration/store/test_migrations.py`` fails when the two disagree). A new nullable
column is also listed in ``schema.ADDED_COLUMNS`` with its revision: stores written before
migrations existed are recognised by the columns they have.
"""
