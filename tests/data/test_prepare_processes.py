"""Issue 39: `cem data prepare`'s tokenising workers never outlive it (kill -9 of the prepare), and Ctrl-C
always ends it, promptly, with exit 130 and shards a rerun completes to the same bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cem.data.tokenshards import prepare_shards

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

# the command line, with small tasks so that the workers have many to do
PREPARE = """
import sys
from cem.cli import main
from cem.data import tokenshards
tokenshards.TASK_CHARS = 20_000
sys.exit(main(["data", "prepare", sys.argv[1], "--tokenizer", "byte", "--out", sys.argv[2], "--workers", "2", "--shard-tokens", "20000"]))
"""


@pytest.fixture
def corpus(jsonl_corpus) -> Path:
    return jsonl_corpus(files=4, docs=2500, seed=2)  # about 1.7 MB in all


def _children(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.add(int(entry.name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start(corpus: Path, out: Path) -> tuple[subprocess.Popen, set[int]]:
    """A prepare in its own session, output to a pipe, once two workers run and a shard is written: the
    process and its children then."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", PREPARE, str(corpus), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    manifest = out / "manifest.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        workers = {p for p in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()}
        if len(workers) == 2 and manifest.is_file() and json.loads(manifest.read_text())["splits"].get("train", {}).get("shards"):
            return proc, _children(proc.pid)
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the prepare ended, or did not start its workers, before it could be stopped: {proc.communicate()[0]!r}")


def _read_to_end(proc: subprocess.Popen, timeout: float) -> bytes | None:
    """What the command wrote, once its output is closed by every process holding it; None if it is still
    open after `timeout` seconds."""
    got = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else None


def test_kill_9_of_a_prepare_takes_its_workers_with_it(corpus, tmp_path):
    proc, children = _start(corpus, tmp_path / "out")
    assert children, "no worker to watch"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = _alive(children)
    for pid in survivors:  # do not leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "workers (or the resource tracker) outlived the killed prepare"
    assert _read_to_end(proc, 10) is not None, "the prepare's output is still held open"


def test_ctrl_c_ends_a_prepare_with_workers_and_a_rerun_completes_it(corpus, tmp_path):
    whole = prepare_shards(str(corpus), "byte", tmp_path / "whole", shard_tokens=20_000, workers=0, progress=False)
    proc, children = _start(corpus, tmp_path / "cut")
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the prepare and its workers
    try:
        assert proc.wait(30) == 130
    finally:
        proc.kill()
    output = _read_to_end(proc, 10)
    assert output is not None and b"interrupted (Ctrl-C)" in output and b"Traceback" not in output
    deadline = time.monotonic() + 10
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(children)
    state = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert not state["complete"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", PREPARE, str(corpus), str(tmp_path / "cut")], env=env, check=True, capture_output=True)
    files = lambda folder: {p.name: p.read_bytes() for p in sorted(folder.glob("*.bin"))}  # noqa: E731
    assert files(tmp_path / "cut") == files(whole) and len(files(whole)) > 3
