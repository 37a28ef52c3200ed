"""Issue 39: the crash test of `cem data prepare` (as for training). Token shards of a folder and of a single
file, and a named corpus copied `--from` a folder, are prepared by a process killed with SIGKILL at random
moments (seeded), several times in a row, then run to the end: no process of the prepare is left (its
process group is empty), no temp file is left, and the result is byte for byte that of an uninterrupted
prepare. A source edited between kills is refused by the next run, naming the file, and a prepare started
over after that gives the shards of the new text. Writes are slowed (a sleep per write) so that the kills
land inside the work."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cem.data import tokenshards
from cem.data.tokenshards import prepare_shards

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

WORDS = "the cat sat on a mat and then ran to its home where café owners said naïve things".split()
TASK_CHARS = 5_000
SHARD_TOKENS = 20_000
KILLS = 3
SHARDS = f"""
import sys, time
from cem.data import tokenshards
tokenshards.TASK_CHARS = {TASK_CHARS}
write = tokenshards._ShardWriter.write
tokenshards._ShardWriter.write = lambda self, ids: (time.sleep(0.1), write(self, ids))
try:
    tokenshards.prepare_shards(sys.argv[1], "byte", sys.argv[2], shard_tokens={SHARD_TOKENS}, workers=1, progress=False)
except ValueError as e:
    sys.exit(f"refused: {{e}}")
"""
COPY = """
import sys, time
from cem.data import prepare as prep
def slow(src, dst, length=0):
    while block := src.read(1 << 14):
        dst.write(block); time.sleep(0.1)
prep.shutil.copyfileobj = slow
prep.prepare("wikitext-2", sys.argv[2], source=sys.argv[1])
"""


def _text(rng: random.Random, n: int) -> str:
    return "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(n)) + "\n"


def _files(folder: Path) -> dict[str, bytes]:
    """Every file but the lock (`_no_temp_files` checks it)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def _group(pgid: int) -> set[int]:
    """The live (not zombie) processes of the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return set()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == pgid:
                found.add(int(entry.name))
    return found


def holds(lock: Path):
    """Whether the process (its pid) holds the folder of `lock` (`cem.io.lock_folder`): its work has begun."""
    return lambda pid: lock.is_file() and lock.read_bytes() == f"{pid}\n".encode()


def _run(script: str, source: Path, out: Path, rng: random.Random | None = None, started=None) -> subprocess.CompletedProcess | None:
    """Run `script` on `source` and `out` in its own process group: to the end (None `rng`), or killed
    with SIGKILL at a random moment once `started(pid)` holds; then check that no process of it is left."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(source), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    result = None
    if rng is None:
        result = subprocess.CompletedProcess(proc.args, proc.wait(300), *proc.communicate())
    else:
        deadline = time.monotonic() + 120
        while not started(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 2.0))
        assert proc.poll() is None, f"the prepare ended before it could be killed: {proc.communicate()}"
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    deadline = time.monotonic() + 20
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group(proc.pid), "a process of the prepare outlived it"
    return result


def _no_temp_files(folder: Path) -> None:
    assert [p.name for p in folder.rglob(".*") if p.name != ".lock"] == []
    assert (folder / ".lock").read_bytes() == b""  # released


def _single_file(tmp_path: Path, rng: random.Random) -> Path:
    path = tmp_path / "book.txt"
    path.write_text(_text(rng, 2500), encoding="utf-8")  # paragraphs: documents of each split
    return path


def _folder(tmp_path: Path, rng: random.Random) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for k in range(3):
        docs = _text(rng, 700).split("\n\n")
        (root / f"part{k}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    (root / "sub" / "page.txt").write_text(_text(rng, 5), encoding="utf-8")
    return root


def _reference(source: Path, out: Path, monkeypatch) -> Path:
    """An uninterrupted prepare, in this process."""
    monkeypatch.setattr(tokenshards, "TASK_CHARS", TASK_CHARS)
    return prepare_shards(str(source), "byte", out, shard_tokens=SHARD_TOKENS, workers=0, progress=False)


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_token_shards_after_kill_9_at_random_moments(tmp_path, monkeypatch, kind):
    rng = random.Random({"folder": 1, "file": 2}[kind])
    source = (_folder if kind == "folder" else _single_file)(tmp_path, rng)
    out = tmp_path / "out"
    for _ in range(KILLS):
        _run(SHARDS, source, out, rng, started=holds(out / ".lock"))
    done = _run(SHARDS, source, out)
    assert done.returncode == 0, done.stderr
    _no_temp_files(out)
    assert _files(out) == _files(_reference(source, tmp_path / "whole", monkeypatch))


def test_a_source_edited_between_kills_is_refused_then_prepared_afresh(tmp_path, monkeypatch):
    rng = random.Random(3)
    source = _folder(tmp_path, rng)
    out = tmp_path / "out"
    manifest = out / "manifest.json"
    one_shard = lambda pid: manifest.is_file() and bool(json.loads(manifest.read_text())["splits"].get("train", {}).get("shards"))  # noqa: E731
    _run(SHARDS, source, out, rng, started=one_shard)
    _run(SHARDS, source, out, rng, started=holds(out / ".lock"))
    with open(source / "part1.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "a document added between the kills"}) + "\n")
    before = _files(out)
    refused = _run(SHARDS, source, out)
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f"refused: {source / 'part1.jsonl'}: changed (its size or modification time differ) since the unfinished token shards "
        f"in {out} were begun from {source}; remove {out} and prepare again to start over from the new text"]
    assert _files(out) == before  # nothing written
    shutil.rmtree(out)  # as the message says
    _run(SHARDS, source, out, rng, started=holds(out / ".lock"))
    done = _run(SHARDS, source, out)
    assert done.returncode == 0, done.stderr
    _no_temp_files(out)
    assert _files(out) == _files(_reference(source, tmp_path / "whole", monkeypatch))


def test_prepare_from_after_kill_9_at_random_moments(tmp_path):
    rng = random.Random(4)
    shared = tmp_path / "shared"
    (shared / "wikitext-2").mkdir(parents=True)
    for split, n in (("train", 3000), ("valid", 300), ("test", 300)):
        (shared / "wikitext-2" / f"{split}.txt").write_text(_text(rng, n).replace("\n\n", " \n = = \n"))
    data = tmp_path / "data"
    for _ in range(KILLS):
        _run(COPY, shared, data, rng, started=holds(data / ".lock"))
    done = _run(COPY, shared, data)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (data / "wikitext-2").iterdir()) == ["test.txt", "train.txt", "valid.txt"]  # no temp file
    assert _files(data / "wikitext-2") == _files(shared / "wikitext-2")
