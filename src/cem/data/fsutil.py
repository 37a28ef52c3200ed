"""Filesystem helpers for the data layer: where caches live and how files are written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def cache_root() -> Path:
    """Root directory of cem's caches: `$CEM_CACHE_DIR`, else `~/.cache/cem`."""
    env = os.environ.get("CEM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cem"


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary temp file next to `path`; on success fsync it and rename it onto `path`.

    Readers therefore see either the old file, no file, or the complete new one; on an
    exception the temp file is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
