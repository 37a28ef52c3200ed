"""torch.compile as cem runs it: in a cache folder of cem's own, recovering by itself from a broken cache artefact.

Inductor builds each kernel into a shared library in its cache folder and, on a later compile of the same graph,
loads the file it finds there without checking it. A compile killed while the linker writes (Ctrl-C, kill of the
process group) leaves that file empty or cut short, and every later compile of that graph then fails with
`ImportError: ... file too short`; one left by inductor's probe of the CPU's vector instructions makes later
compiles drop them without a word. `compiled` discards the libraries that are cut short before compiling, and wraps
the compiled callable so that a failure to load one discards it and compiles once more, saying so in one line.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Callable

import torch

from cem.data.fsutil import cache_root

__all__ = ["broken_artefact", "compiled", "inductor_cache_dir"]

ENV = "TORCHINDUCTOR_CACHE_DIR"
_LIBRARY = re.compile(r"(/\S+?\.so)\b")


def inductor_cache_dir() -> Path:
    """Inductor's cache folder: $TORCHINDUCTOR_CACHE_DIR where the user set it, else cem's own
    (`cache_root()/inductor`, per user), which this sets so that torch uses it (torch sets the variable to its
    shared default, in the temporary folder, the first time it looks)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get(ENV) in (None, "", default_cache_dir()):
        os.environ[ENV] = str(cache_root() / "inductor")
    return Path(os.environ[ENV]).expanduser().absolute()


def broken_artefact(exc: BaseException) -> Path | None:
    """The cached library that a failed compile could not load (the ImportError / OSError inside inductor's error
    naming a `.so` in the cache folder), or None when the failure is something else."""
    root = inductor_cache_dir()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ImportError, OSError)):
            for found in _LIBRARY.findall(str(exc)):
                path = Path(found)
                if path.is_relative_to(root):
                    return path
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None


def _is_broken(path: Path) -> bool:
    """Whether a library in the cache is cut short: empty, no ELF header, or its section headers (which the linker
    writes last, at the end) reaching past the end of the file."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return True
    if head[4] != 2:  # ELFCLASS32: its header has another layout; trust it
        return False
    order = "little" if head[5] == 1 else "big"
    shoff, shentsize, shnum = (int.from_bytes(head[a:b], order) for a, b in ((0x28, 0x30), (0x3A, 0x3C), (0x3C, 0x3E)))
    return shoff + shentsize * shnum > size


def _discard(named: Path | None = None) -> None:
    """Remove `named` and every broken library in the cache folder (what a killed link leaves), each under
    inductor's lock for its key, skipping one that another process is building now; says so in one line."""
    from torch._inductor.codecache import get_lock_dir
    from torch._inductor.utils import clear_caches
    from filelock import Timeout
    from torch.utils._filelock import FileLock

    root = inductor_cache_dir()
    broken = [p for p in root.rglob("*.so") if p == named or _is_broken(p)] if root.is_dir() else []
    if named is not None and named not in broken:
        broken.append(named)
    gone = []
    for path in broken:
        try:
            with FileLock(os.path.join(get_lock_dir(), path.name.split(".")[0] + ".lock"), timeout=0):
                path.unlink(missing_ok=True)
                gone.append(path)
        except Timeout:
            continue
    if gone:
        clear_caches()  # inductor's in-process memo of what it loaded (or failed to) from those paths
        print(f"cem: discarded {len(gone)} broken librar{'y' if len(gone) == 1 else 'ies'} from torch's inductor cache "
              f"{root} ({gone[0].name}{', ...' if len(gone) > 1 else ''}; a compile killed while linking leaves them)",
              file=sys.stderr, flush=True)


def _recovering(call: Callable) -> Callable:
    """`call`, compiled again once when its compile fails on a broken cache artefact (`broken_artefact`)."""

    @functools.wraps(call)
    def run(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            broken = broken_artefact(exc)
            if broken is None:
                raise
        _discard(broken)
        return call(*args, **kwargs)

    return run


def compiled(fn, **kwargs):
    """torch.compile(fn, **kwargs) with inductor's cache in `inductor_cache_dir`, its broken libraries discarded
    first, and recovering once per call from one that fails the load; a module stays a module (`forward` wrapped)."""
    _discard()
    out = torch.compile(fn, **kwargs)
    if isinstance(out, torch.nn.Module):
        out.forward = _recovering(out.forward)
        return out
    return _recovering(out)
