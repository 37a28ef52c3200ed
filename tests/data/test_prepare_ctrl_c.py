"""Issue 63: Ctrl-C of `cem data prepare` never hangs. A terminal's Ctrl-C (SIGINT to the process group) at 100
random moments of a prepare with two tokenising workers, spread over its whole life (start-up and imports, the
workers starting, shards being written, the manifest finished, the exit): each ends within BOUND seconds, with
exit 130 and one line on stderr saying so (or, past the end, exit 0 and complete shards)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Slow: 3 min on the shared two-core machine at load 5, 8 min at load 11 (465 CPU seconds). CI's rehearsal (2026-12-01, idle) found 3 of 100 bad before the fixes of
# issue 63, item 4: a hang (`stop_pool`), a traceback from a Ctrl-C while `cem.__main__` imported `signal`, and an
# "Exception ignored in" traceback from one that landed in a finalizer (both `cem.__main__`); each has a test of its own.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups")]

POINTS = 100
AT_ONCE = 3  # prepares running together (each mostly waits on imports: two cores keep three busy)
BOUND = 20.0  # seconds from the Ctrl-C to the exit, on a loaded two-core machine (a prompt exit takes 1-3)
PREPARE = """
import importlib.machinery, sys
print("started", flush=True)  # the test counts from here: the interpreter's own start-up is Python's, not cem's

class SmallTasks:  # the `cem` command, with small tasks so that the workers have many to do
    @staticmethod
    def find_spec(name, path, target=None):
        if name != "cem.data.tokenshards":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        spec.loader.exec_module = lambda module: (load(module), setattr(module, "TASK_CHARS", 20_000))
        return spec

sys.meta_path.insert(0, SmallTasks)
sys.argv = ["cem", "data", "prepare", sys.argv[1], "--tokenizer", "byte", "--out", sys.argv[2], "--workers", "2", "--shard-tokens", "20000"]
from cem.__main__ import run
sys.exit(run())
"""


@pytest.fixture
def corpus(jsonl_corpus) -> Path:
    return jsonl_corpus(files=2, docs=600, seed=3)  # about 200 kB: ten tasks, nine shards


def _lines(stderr: str) -> list[str]:
    """stderr's lines without the progress bar (tqdm redraws it after carriage returns)."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and "tok [" not in line]


def _interrupt_at(corpus: Path, out: Path, delay: float) -> tuple[float, int | None, float, str]:
    """Start a prepare, Ctrl-C it `delay` seconds later; (delay, exit code or None if still running BOUND seconds
    after the signal, seconds from the signal to the exit, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", PREPARE, str(corpus), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    assert proc.stdout.readline() == "started\n"
    try:
        proc.wait(delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
    signalled = time.monotonic()
    try:
        err = proc.communicate(timeout=BOUND)[1]
        return delay, proc.returncode, time.monotonic() - signalled, err
    except subprocess.TimeoutExpired:
        with open(f"/proc/{proc.pid}/wchan", errors="replace") as f:
            where = f.read()
        os.killpg(proc.pid, signal.SIGKILL)
        return delay, None, BOUND, f"(still running, in {where}) " + (proc.communicate()[1] or "")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_ctrl_c_of_a_prepare_never_hangs(corpus, tmp_path):
    started = time.monotonic()
    delay, code, _, err = _interrupt_at(corpus, tmp_path / "whole", 600.0)
    assert code == 0, err
    whole = time.monotonic() - started
    rng = random.Random(63)
    delays = [whole * 1.05 * (k + rng.random()) / POINTS for k in range(POINTS)]  # one in each of 100 equal slices
    with ThreadPoolExecutor(AT_ONCE) as pool:
        results = list(pool.map(lambda k: _interrupt_at(corpus, tmp_path / f"out{k}", delays[k]), range(POINTS)))
    bad = []
    for (delay, code, took, err), k in zip(results, range(POINTS)):
        lines = _lines(err)
        done = code == 0 and json.loads((tmp_path / f"out{k}" / "manifest.json").read_text())["complete"] and all(" ready in " in line for line in lines)
        said = code == 130 and len(lines) == 1 and lines[0].endswith("error: interrupted (Ctrl-C)")
        if not (done or said):
            bad.append(f"at {delay:.2f}s: exit {code} after {took:.1f}s: {err[-600:]!r}")
    assert not bad, f"{len(bad)} of {POINTS} Ctrl-Cs (a whole prepare: {whole:.1f}s):\n" + "\n".join(bad)
