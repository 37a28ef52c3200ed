"""Issue 39: `cem data prepare` under faults. A resumed prepare refuses a source changed since it began
(naming the file), so that its shards never mix the old text and the new; one prepare at a time holds a
shard folder or data directory (a second is refused, naming the lock and the holder's pid); the next
prepare removes the temp files a killed one left, and only those."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from cem.data import prepare as prep
from cem.data import tokenshards
from cem.data.tokenshards import prepare_shards
from cem.io import LockedError, lock_folder

WORDS = "the cat sat on a mat and then ran to its home where café owners said naïve things".split()
KW = dict(shard_tokens=3000, workers=0, progress=False)


def _docs(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def write_corpus(root: Path, seed: int = 0) -> Path:
    """A folder of two .jsonl files (about 70 kB; each holds documents of every split)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(2):
        (root / f"part{k}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs(rng, 1000)), encoding="utf-8")
    return root


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _interrupted(source: Path, out: Path, monkeypatch, after: int = 2) -> None:
    """A prepare of `source` into `out` stopped (as by Ctrl-C) after `after` shards."""
    real = tokenshards._record

    def record_then_stop(*args):
        real(*args)
        if sum(len(s["shards"]) for s in args[1]["splits"].values()) == after:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(tokenshards, "_record", record_then_stop)
        with pytest.raises(KeyboardInterrupt):
            prepare_shards(str(source), "byte", out, **KW)


def _edit(path: Path) -> None:
    """Append a document to a corpus file (its size and modification time change)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "a document added after the prepare began"}) + "\n")


@pytest.mark.parametrize("change", ["edited", "added", "removed"])
def test_a_resumed_prepare_refuses_a_changed_folder_source_naming_the_file(tmp_path, monkeypatch, change):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    _interrupted(corpus, out, monkeypatch)
    changed = {"edited": corpus / "part1.jsonl", "added": corpus / "sub" / "new.txt", "removed": corpus / "part0.jsonl"}[change]
    if change == "edited":
        _edit(changed)
    elif change == "added":
        changed.parent.mkdir()
        changed.write_text("new text\n", encoding="utf-8")
    else:
        changed.unlink()
    shards_before = files_of(out)
    how = "changed" if change == "edited" else change
    with pytest.raises(ValueError, match=rf"^{re.escape(str(changed))}: {how}.* since the unfinished token shards in {re.escape(str(out))} "
                                         rf"were begun .*; remove {re.escape(str(out))} and prepare again"):
        prepare_shards(str(corpus), "byte", out, **KW)
    assert files_of(out) == shards_before  # refused before anything is written
    shutil.rmtree(out)  # what the message says: then the shards are those of the new text
    assert files_of(prepare_shards(str(corpus), "byte", out, **KW)) == files_of(prepare_shards(str(corpus), "byte", tmp_path / "whole", **KW))


def test_a_resumed_prepare_refuses_an_edited_single_file(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus") / "part0.jsonl"
    out = tmp_path / "out"
    _interrupted(corpus, out, monkeypatch, after=1)
    _edit(corpus)
    with pytest.raises(ValueError) as e:
        prepare_shards(str(corpus), "byte", out, **KW)
    assert str(e.value).startswith(f"{corpus}: changed (its size or modification time differ)") and "\n" not in str(e.value)


def test_a_resumed_prepare_of_an_unchanged_source_continues(tmp_path, monkeypatch):
    """Files a folder source does not read (not .txt/.jsonl/.parquet) may change; so may the source's own
    folder's timestamps."""
    corpus = write_corpus(tmp_path / "corpus")
    whole = prepare_shards(str(corpus), "byte", tmp_path / "whole", **KW)
    _interrupted(corpus, tmp_path / "out", monkeypatch)
    (corpus / "README.md").write_text("notes\n")
    assert files_of(prepare_shards(str(corpus), "byte", tmp_path / "out", **KW)) == files_of(whole)


def test_the_ready_line_is_said_once_the_folder_is_released(tmp_path, monkeypatch):
    """Issue 63: the last line of a prepare came before it released its folder, so that a Ctrl-C after it (still in
    the command) said "interrupted" under "ready"; now releasing the folder is done before the line."""
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    said = []

    def say(show, message):
        with lock_folder(out, "the folder"):  # a LockedError while the prepare still holds it
            said.append(message)

    monkeypatch.setattr(tokenshards, "_say", say)
    prepare_shards(str(corpus), "byte", out, **KW)
    assert len(said) == 1 and said[0].startswith(f"token shards of {corpus} ready in {out}: train ")


def test_a_second_prepare_into_one_folder_is_refused_naming_the_lock_and_holder(tmp_path, monkeypatch):
    """Before, the second prepare took the first's temp files for a killed prepare's and removed them,
    and the first died; now it is refused and the first finishes."""
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    real, refused = tokenshards._record, []

    def record_and_start_another(*args):
        real(*args)
        if not refused:
            with pytest.raises(LockedError) as e:
                prepare_shards(str(corpus), "byte", out, **KW)
            refused.append(str(e.value))

    monkeypatch.setattr(tokenshards, "_record", record_and_start_another)
    prepare_shards(str(corpus), "byte", out, **KW)
    assert refused == [f"token-shard folder {out} is in use by another process (pid {os.getpid()}, lock {out / '.lock'}); "
                       "wait for it to finish or stop it, or choose another --out"]
    monkeypatch.undo()
    assert files_of(out) == files_of(prepare_shards(str(corpus), "byte", tmp_path / "whole", **KW))


def test_a_prepare_removes_only_the_temp_files_a_killed_prepare_left(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    _interrupted(corpus, out, monkeypatch)
    stale = [out / ".train-00002.bin.ab12cd_9.tmp", out / ".manifest.json.zzzzzzzz.tmp", out / "tokenizer" / ".meta.json.k3j4h5g6.tmp"]
    for path in stale:
        path.write_bytes(b"left by kill -9")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    kept = [out / ".notes.txt.abcdefgh.tmp", out / "train-00009.bin.tmp"]  # not names of a prepare's temp files
    for path in kept:
        path.write_text("someone else's")
    (out / ".train-00003.bin.qqqqqqqq.tmp").symlink_to(victim)  # a link is never removed nor followed
    prepare_shards(str(corpus), "byte", out, **KW)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert (out / ".train-00003.bin.qqqqqqqq.tmp").is_symlink() and victim.read_text() == "keep"


def _wikitext(shared: Path) -> Path:
    (shared / "wikitext-2").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (shared / "wikitext-2" / f"{split}.txt").write_text(f" = {split} = \n energy falls \n" * 50)
    return shared


def test_prepare_from_removes_the_temp_file_a_killed_copy_left(tmp_path):
    shared = _wikitext(tmp_path / "shared")
    data = tmp_path / "data"
    (data / "wikitext-2").mkdir(parents=True)
    stale = data / "wikitext-2" / ".train.txt.x1y2z3w4.tmp"  # what a kill -9 mid-copy left (atomic_write's temp file)
    stale.write_text(" = train = \n ener")
    other = data / "wikitext-2" / ".mine.txt.x1y2z3w4.tmp"
    other.write_text("not the prepare's")
    prep.prepare("wikitext-2", data, source=shared)
    assert not stale.exists() and other.exists()
    assert (data / "wikitext-2" / "train.txt").read_bytes() == (shared / "wikitext-2" / "train.txt").read_bytes()


def test_a_second_prepare_of_a_data_directory_is_refused(tmp_path):
    shared = _wikitext(tmp_path / "shared")
    data = tmp_path / "data"
    with lock_folder(data, f"data directory {data}"):  # held, as by another prepare
        with pytest.raises(LockedError, match=re.escape(f"data directory {data} is in use by another process (pid {os.getpid()}, lock {data}/.lock)")):
            prep.prepare("wikitext-2", data, source=shared)
    prep.prepare("wikitext-2", data, source=shared)


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_resumed_prepare_refuses_text_replaced_with_its_size_and_time_kept(tmp_path, monkeypatch, kind):
    """Issue 63: after a killed prepare, part of the source replaced by as many other bytes and its modification time
    put back (`cp -p`, `rsync -t`) was not noticed: the shards would mix old and new text."""
    corpus = write_corpus(tmp_path / "corpus")
    source = corpus if kind == "folder" else corpus / "part1.jsonl"
    out = tmp_path / "out"
    _interrupted(source, out, monkeypatch, after=1)
    target = corpus / "part1.jsonl"
    st = target.stat()
    data = target.read_bytes()
    middle = len(data) // 2
    target.write_bytes(data[:middle] + data[middle:].replace(b"a", b"e"))  # the same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(ValueError, match=rf"^{re.escape(str(target))}: changed \(its content differs, with the same size and modification time\)"):
        prepare_shards(str(source), "byte", out, **KW)


def test_a_resumed_prepare_begun_by_an_older_cem_checks_size_and_time(tmp_path, monkeypatch):
    """A manifest of an older cem records [size, mtime] per file: an unchanged source still continues."""
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    _interrupted(corpus, out, monkeypatch, after=1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["source_files"] = {name: entry[:2] for name, entry in manifest["source_files"].items()}
    (out / "manifest.json").write_text(json.dumps(manifest))
    shards = lambda folder: {k: v for k, v in files_of(folder).items() if k.endswith(".bin")}  # noqa: E731
    assert shards(prepare_shards(str(corpus), "byte", out, **KW)) == shards(prepare_shards(str(corpus), "byte", tmp_path / "whole", **KW))
