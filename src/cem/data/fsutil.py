"""Where the data layer's caches live (atomic writes: `cem.io`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Root directory of cem's caches: `$CEM_CACHE_DIR`, else `~/.cache/cem`."""
    env = os.environ.get("CEM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cem"
