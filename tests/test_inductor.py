"""cem.inductor: torch.compile in cem's own cache, recovering from the broken library a killed compile leaves."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cem import inductor
from cem.inductor import broken_artefact, compiled, inductor_cache_dir


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))


def _fresh_process_state() -> None:
    """Forget what this process compiled and loaded, as a new process would."""
    torch._dynamo.reset()
    from torch._inductor.utils import clear_caches

    clear_caches()


def test_own_cache_unless_the_user_set_one(monkeypatch, tmp_path):
    monkeypatch.delenv(inductor.ENV, raising=False)
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cem"))
    assert inductor_cache_dir() == tmp_path / "cem" / "inductor"
    assert os.environ[inductor.ENV] == str(tmp_path / "cem" / "inductor")
    monkeypatch.setenv(inductor.ENV, str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"


def test_other_failures_are_not_taken_for_a_broken_artefact(monkeypatch, tmp_path):
    monkeypatch.setenv(inductor.ENV, str(tmp_path))
    assert broken_artefact(RuntimeError("boom")) is None
    assert broken_artefact(ImportError("/elsewhere/x.so: file too short")) is None  # not in the cache
    assert broken_artefact(ImportError(f"{tmp_path}/ab/cab.main.so: file too short")) == tmp_path / "ab" / "cab.main.so"


def _cache_of_one_compile(monkeypatch, tmp_path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A cache folder holding one compiled model's graphs and libraries, not loaded by this process (a copy at a
    new path: this process has the first one's libraries loaded); the input and the compiled output."""
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv(inductor.ENV, str(first))
    x = torch.randn(4, 8)
    want = compiled(_model())(x)
    _fresh_process_state()
    shutil.copytree(first, second)
    assert list(second.rglob("*.main.so"))
    monkeypatch.setenv(inductor.ENV, str(second))
    return second, x, want


def _empty_libraries(cache: Path, libraries: list[Path] | None = None) -> list[Path]:
    """Empty each kernel library in `cache` (or those given) as a linker killed mid-link leaves its output."""
    libraries = sorted(cache.rglob("*.main.so")) if libraries is None else libraries
    for lib in libraries:
        lib.unlink()
        lib.touch()
    return libraries


def _one_note(err: str) -> str:
    notes = [line for line in err.splitlines() if "broken" in line]
    assert len(notes) == 1 and notes[0].startswith("cem: discarded") and "inductor cache" in notes[0], err
    return notes[0]


@pytest.mark.slow  # a real compile, twice (10 s); the fast tier keeps the sweep before compiling
def test_a_library_found_broken_at_load_is_discarded_and_the_compile_retried(monkeypatch, tmp_path, capfd):
    """The library emptied after `compiled` swept the cache (another process killed meanwhile): the compile fails
    to load it (without the recovery: InductorError: ImportError: ... file too short), discards it, compiles again."""
    cache, x, want = _cache_of_one_compile(monkeypatch, tmp_path)
    model = compiled(_model())
    _empty_libraries(cache)
    capfd.readouterr()
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    _one_note(capfd.readouterr().err)
    assert not [p for p in cache.rglob("*.so") if p.stat().st_size == 0]
    _fresh_process_state()


def test_broken_libraries_are_discarded_before_compiling(monkeypatch, tmp_path, capfd):
    """An empty library and one cut short mid-write (its section headers missing) are swept before the compile."""
    cache, x, want = _cache_of_one_compile(monkeypatch, tmp_path)
    cut, *others = sorted(cache.rglob("*.main.so"))
    assert not inductor._is_broken(cut)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    emptied = _empty_libraries(cache, others)
    capfd.readouterr()
    model = compiled(_model())
    assert f"discarded {len(emptied) + 1} broken librar" in _one_note(capfd.readouterr().err)
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    assert not any(inductor._is_broken(p) for p in cache.rglob("*.so"))
    _fresh_process_state()


KILLED_LINKER = """#!/bin/sh
# g++, killed with its whole process group as it starts writing a kernel's library (what Ctrl-C mid-link leaves)
prev=; out=
for a; do [ "$prev" = -o ] && out="$a"; prev="$a"; done
case "$out" in *.main.so) : > "$out"; kill -KILL 0;; esac
exec {gxx} "$@"
"""


@pytest.mark.slow
def test_a_compile_killed_mid_link_does_not_poison_the_next_run(corpus_dir, tmp_path):
    """Kill `cem train compile=true` (its process group) while the linker writes a kernel's library, then train
    afresh with the same cache: the rerun discards the empty library, says so in one line, and finishes."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ for inductor")
    wrapper = tmp_path / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(KILLED_LINKER.format(gxx=gxx))
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != inductor.ENV}
    env.update(CEM_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(filter(None, [str(Path(inductor.__file__).parents[1]), env.get("PYTHONPATH")])))
    train = [sys.executable, "-m", "cem", "train", "--data", str(corpus_dir), "--preset", "tiny", "--batch-size", "2", "--quiet",
             "--max-steps", "2", "context=32", "tensorboard=false", "eval_every=0", "compile=true"]
    killed = subprocess.Popen([*train, "--out", str(tmp_path / "run1")], env={**env, "PATH": f"{wrapper.parent}{os.pathsep}{env['PATH']}"},
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        err = killed.communicate(timeout=400)[1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL, err
    empty = [p for p in (tmp_path / "cache" / "inductor").rglob("*.so") if p.stat().st_size == 0]
    assert empty, "the kill left no empty library"
    rerun = subprocess.run([*train, "--out", str(tmp_path / "run2")], env=env, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _one_note(rerun.stderr)
    assert (tmp_path / "run2" / "results.json").exists()


def test_torchs_own_default_is_not_taken_for_the_users_choice(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(inductor.ENV, default_cache_dir())  # what torch writes there the first time it looks
    assert inductor_cache_dir() == tmp_path / "inductor"
