"""The user's cache directory, where evalkube keeps what it can make again."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_home() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
