"""Safe file writes: atomic (readers see the old file, no file, or the whole new one, never half of it),
never through a symbolic link the program did not create (a planted link is refused, or replaced by the
atomic rename, never followed); folder locks (one writer per folder); and file checksums."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

__all__ = [
    "atomic_write", "atomic_write_json", "atomic_write_text", "default_mode", "fix_modes", "half_moved", "lock_folder", "LockedError", "make_temp_dir",
    "open_append", "staged_folder", "open_no_follow", "outside_folder", "read_json", "refuse_link", "remove_stale_temp_files", "sha256_file",
]

LOCK_FILE = ".lock"  # in a locked folder (`lock_folder`): held with flock by the writing process; holds its pid
MOVING = ".moving-in"  # in a folder `staged_folder` moves files into, while it does: the staging folder's name


class LockedError(ValueError):
    """Another live process holds the folder (`lock_folder`)."""


def _flock(fd: int) -> bool:
    """Take an exclusive flock on `fd` without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


@contextlib.contextmanager
def lock_folder(folder: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold `folder` (made if need be) for this process: an exclusive flock on `folder/.lock`, which records
    the pid until it is released; a second writer gets a LockedError naming `what` (e.g. "run directory
    PATH"), the lock and the holder's pid. The kernel drops the lock when the process ends, however it
    ends, so a crashed writer never leaves the folder locked; a folder this call made that holds only the
    lock at the end is removed."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock_file = folder / LOCK_FILE
    fd = open_no_follow(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _flock(fd):
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise LockedError(f"{what} is in use by another process (pid {holder}, lock {lock_file}); "
                              "wait for it to finish or stop it, or choose another --out")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: no pid (a killed holder's stays, `_abandoned`)
            if created:  # a writer that failed before writing anything leaves no folder holding only `.lock`
                with contextlib.suppress(OSError):
                    if [p.name for p in folder.iterdir()] == [LOCK_FILE]:
                        lock_file.unlink()
                        folder.rmdir()
    finally:
        os.close(fd)  # releases the flock


def _abandoned(folder: Path) -> bool:
    """Whether `folder` (a real folder, not a link) was locked (`lock_folder`) by a process that is gone:
    its lock records a pid (written once the flock was held) and nobody holds the flock now."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no lock (yet), or a link
        return False
    try:
        return bool(os.pread(fd, 64, 0).strip()) and _flock(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(folder: str | os.PathLike, names: str) -> None:
    """Remove the temp files `atomic_write` left in `folder` for files whose names match the regular
    expression `names` (`.NAME.XXXXXXXX.tmp`: a writer killed mid-write). Only for a folder this process
    holds (`lock_folder`): no other writer is at it. Plain files only; a link is left alone."""
    pattern = re.compile(rf"\.(?:{names})\.[a-z0-9_]{{8}}\.tmp")
    with contextlib.suppress(FileNotFoundError):
        for entry in Path(folder).iterdir():
            if pattern.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
                entry.unlink(missing_ok=True)


def default_mode(directory: bool = False) -> int:
    """The permissions `open`/`mkdir` would give a new file (0o666) or folder (0o777) under the process's
    umask. Temporary files and folders are created 0o600/0o700; atomic writes set this mode before the
    rename, so group-shared run folders keep working."""
    return (0o777 if directory else 0o666) & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc/self/status): setting it
    to read it back is process-wide, and a file another thread created in between would get mode 0o666."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0)
    os.umask(umask)
    return umask


def fix_modes(folder: str | os.PathLike, pattern: str = "*.safetensors") -> None:
    """Give the files matching `pattern` that a library just wrote into `folder` the umask's mode
    (`default_mode`): safetensors creates its files 0o600 whatever the umask. Links are left alone."""
    for path in Path(folder).glob(pattern):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, default_mode())


def make_temp_dir(parent: str | os.PathLike, prefix: str) -> Path:
    """`tempfile.mkdtemp` in `parent`, with the mode of a folder made by `mkdir` (`default_mode`): it is
    renamed into place as a checkpoint or export folder."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, default_mode(directory=True))
    return tmp


@contextlib.contextmanager
def staged_folder(directory: str | os.PathLike, last: tuple[str, ...] = ("config.json",)) -> Iterator[Path]:
    """Yield a temp folder beside `directory` to write a model folder into; on success move what was written
    there into `directory` (made if need be) by renames, the files named in `last` after the others (a reader
    that finds config.json finds the rest), and remove the temp folder. On failure (a full disk, a file size
    limit, Ctrl-C) only the temp folder is removed: `directory` keeps what it held. Renames replace a planted
    link at a name instead of writing through it. The temp folder is locked (`lock_folder`) while it is
    written, and a successful write removes those of writers to `directory` killed before they finished."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(directory.parent, _staging_prefix(directory))
    try:
        with lock_folder(tmp, f"staging folder {tmp}"):  # while it is locked, no other writer takes it for a killed one's
            yield tmp
            directory.mkdir(exist_ok=True)
            atomic_write_text(directory / MOVING, f"{tmp.name}\n")  # until the last file is in: `half_moved`
            _move_into(tmp, directory, last, skip=(LOCK_FILE,))
            (directory / MOVING).unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for entry in _staging_folders(directory):  # the temp folders of writers killed before they finished (kill -9)
        if _abandoned(entry):
            shutil.rmtree(entry, ignore_errors=True)


STAGING_NAME_MAX = 200  # of the folder's name in its staging folders' (`.NAME.XXXXXXXX`): a name may have 255 bytes


def _staging_prefix(directory: Path) -> str:
    """The start of `staged_folder`'s temp folders' names for `directory`: its name (cut to STAGING_NAME_MAX bytes) dotted."""
    return f".{directory.name.encode()[:STAGING_NAME_MAX].decode(errors='ignore')}."


def _staging_folders(directory: Path) -> list[Path]:
    """The folders beside `directory` named as `staged_folder` names its temp folders for it."""
    pattern = re.compile(rf"{re.escape(_staging_prefix(directory))}[a-z0-9_]{{8}}")  # `make_temp_dir`'s names for this `directory`
    return [entry for entry in directory.parent.iterdir() if pattern.fullmatch(entry.name)]


def half_moved(directory: str | os.PathLike) -> Path | None:
    """The staging folder of a `staged_folder` write killed while it moved its files into `directory`: named by the
    MOVING note `directory` holds, and its writer gone; None otherwise (a new write then cleans both up)."""
    directory = Path(directory)
    try:
        name = refuse_link(directory / MOVING).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    staging = directory.parent / name
    return staging if staging in _staging_folders(directory) and _abandoned(staging) else None


def _move_into(src: Path, dst: Path, last: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted((e for e in src.iterdir() if e.name not in skip), key=lambda p: (p.name in last, p.name)):
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir() and not target.is_symlink():
            _move_into(entry, target)
        else:
            os.replace(entry, target)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a binary temp file next to `path`; on success fsync it and rename it onto `path`.

    On an exception the temp file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, default_mode())
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
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path) as f:
        f.write(text.encode("utf-8"))
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 2) -> Path:
    """Write `obj` as JSON to `path` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent))


def refuse_link(path: str | os.PathLike) -> Path:
    """`path`, unless it is a symbolic link: then a ValueError naming it (call before writing into a
    file or folder that another program may have planted as a link, e.g. in a shared run folder)."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; refusing to write through it (remove the link, or choose another folder)")
    return path


def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """`os.open(path, flags | O_NOFOLLOW)`: a file descriptor, or a ValueError naming `path` when it is a
    symbolic link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)
        raise


def open_append(path: str | os.PathLike) -> TextIO:
    """`path` opened for appending text (created if missing), never through a symbolic link."""
    return os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", newline="")


def read_json(path: str | os.PathLike, mapping: bool = True):
    """The JSON value in `path`; a ValueError naming the file when it is not UTF-8 JSON, nests too deeply,
    or (with `mapping`) is not an object."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, not UTF-8, or an integer of more than 4300 digits
        raise ValueError(f"{path} is corrupted: not JSON ({str(e).split(';')[0]})") from None
    except RecursionError:
        raise ValueError(f"{path} is corrupted: JSON nested too deeply") from None
    if mapping and not isinstance(value, dict):
        raise ValueError(f"{path} is corrupted: expected a JSON object, got {type(value).__name__}")
    return value


def outside_folder(manifest: str | os.PathLike, names) -> str | None:
    """The first of `names` (the files a manifest lists) that is no file name inside the manifest's folder (absolute,
    climbing out with `..`, a symbolic link leading out, not a string), as a problem naming the manifest and the entry;
    None if every one is inside. A manifest lists files of its own folder: nothing elsewhere is read or hashed."""
    folder = Path(manifest).parent.resolve()
    for name in names:
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
                or not (folder / name).resolve().is_relative_to(folder):
            return f"{manifest} lists {name!r}, which is not a file in its folder {folder}"
    return None


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
