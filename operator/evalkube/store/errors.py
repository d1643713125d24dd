"""The store's one error type, shared by the store and its migrations."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message says which URL and why."""
