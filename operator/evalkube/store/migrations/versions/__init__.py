"""Revision files, one per change of the store's tables (Alembic ignores this file)."""
