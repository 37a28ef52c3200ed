"""`cem data prepare`: each corpus's files written in the loader's layout, from fake network functions or a
local copy (the tests have no network), and found afterwards without --data-dir."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from cem.cli import main
from cem.data import load_corpus, prepared_data_dir
from cem.data import prepare as prep


def _fake_rows(name, config, split):
    if name == "Salesforce/wikitext":
        return iter([{"text": " \n"}, {"text": f" = {split} = \n"}, {"text": " \n"}, {"text": f" Some {split} text . \n"}])
    assert name == "roneneldan/TinyStories"
    return iter({"text": f"Story {i} of {split}.\n\nThe end.\n"} for i in range(50_000))


def test_wikitext2_and_tinystories_from_the_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(prep, "hf_rows", _fake_rows)
    for name in ("wikitext-2", "tinystories"):
        assert prep.prepare(name, tmp_path) == tmp_path
    assert (tmp_path / "wikitext-2/valid.txt").read_text() == " \n = validation = \n \n Some validation text . \n"
    stories = load_corpus("tinystories", tmp_path)
    assert len(stories.splits["train"]) == prep.TINYSTORIES_TRAIN_STORIES
    assert stories.splits["train"][0] == "Story 0 of train.\n\nThe end.\n"
    held_out = (tmp_path / prep.FILES["tinystories"][1]).read_text()
    assert held_out.startswith("Story 0 of validation.\n\nThe end.\n\nStory 1")
    assert prep.TINYSTORIES_VALID_BYTES <= len(held_out) < prep.TINYSTORIES_VALID_BYTES + 100


def test_downloads_are_checked(monkeypatch, tmp_path):
    text = b"First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50
    monkeypatch.setattr(prep, "download", lambda url, dest: Path(dest).write_bytes(text))
    monkeypatch.setattr(prep, "TINYSHAKESPEARE_SHA256", hashlib.sha256(text).hexdigest())
    prep.prepare("tinyshakespeare", tmp_path)
    assert load_corpus("tinyshakespeare", tmp_path).splits["train"][0].startswith("First Citizen")
    monkeypatch.setattr(prep, "TINYSHAKESPEARE_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        prep.prepare("tinyshakespeare", tmp_path / "other")
    assert not (tmp_path / "other/tinyshakespeare/input.txt").exists()


def test_enwik8_zip(monkeypatch, tmp_path):
    def fake(url, dest):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("enwik8", b"<mediawiki>" + b"x" * (10**8 - 11))
        Path(dest).write_bytes(buf.getvalue())

    monkeypatch.setattr(prep, "ENWIK8_URL", "file:///nowhere")
    monkeypatch.setattr(prep, "download", fake)
    prep.prepare("enwik8", tmp_path)
    assert (tmp_path / "enwik8/enwik8.zip").is_file()


def test_cli_copies_a_local_copy_into_the_default_and_train_finds_it(shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ./data here
    assert main(["data", "prepare", "tinyshakespeare", "--from", str(shared_data)]) == 0
    assert (prepared_data_dir() / "tinyshakespeare/input.txt").is_file()
    assert main(["data", "prepare", "tinyshakespeare"]) == 0  # already there: kept
    assert "already" in capsys.readouterr().err
    assert load_corpus("tinyshakespeare").name == "tinyshakespeare"  # no --data-dir needed


def test_unknown_corpus(tmp_path, capsys):
    assert main(["data", "prepare", "python-stdlib", "--data-dir", str(tmp_path)]) == 2
    assert "cannot prepare 'python-stdlib'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="embedded"):
        prep.prepare("python-stdlib", tmp_path)


def test_a_copy_cut_short_is_never_trusted(tmp_path, monkeypatch):
    """Issue 20: a kill mid-copy left a truncated corpus that the rerun called 'already there'. The copy is
    atomic now (nothing at the name until it is whole), and a short file left by an older cem is copied
    again; a symbolic link planted at the corpus's name is replaced, its target untouched."""
    dest = tmp_path / "d" / "tinyshakespeare/input.txt"
    whole = b"First Citizen:\nBefore we proceed any further, hear me speak.\n" * 500
    shared_data = tmp_path / "shared"
    (shared_data / "tinyshakespeare").mkdir(parents=True)
    (shared_data / "tinyshakespeare/input.txt").write_bytes(whole)

    def killed(src, dst, length=0):
        dst.write(src.read(100))
        raise KeyboardInterrupt

    monkeypatch.setattr(prep.shutil, "copyfileobj", killed)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare("tinyshakespeare", tmp_path / "d", source=shared_data)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    monkeypatch.undo()
    dest.write_bytes(whole[:100])  # what shutil.copyfile left behind
    prep.prepare("tinyshakespeare", tmp_path / "d", source=shared_data)
    assert dest.read_bytes() == whole
    victim = tmp_path / "victim"
    victim.write_text("keep")
    dest.unlink()
    dest.symlink_to(victim)
    prep.prepare("tinyshakespeare", tmp_path / "d", source=shared_data)
    assert victim.read_text() == "keep" and not dest.is_symlink() and dest.read_bytes() == whole


@pytest.mark.slow
def test_kill_9_at_random_moments_of_a_copy_then_rerun(tmp_path):
    """The crash test of `cem data prepare --from` (as for training): a prepare killed with SIGKILL at random
    moments, five times in a row on one data directory, then run to the end, leaves the corpus byte for
    byte equal to its source, and never a file at the corpus's name that is not whole. The copy is slowed
    (a sleep per 64 KiB), and each kill comes at a random moment after a copy has started."""
    import random
    import signal
    import subprocess
    import sys
    import time

    shared = tmp_path / "shared" / "wikitext-2"
    shared.mkdir(parents=True)
    rng = random.Random(0)
    for split, n in (("train", 40), ("valid", 8), ("test", 8)):
        (shared / f"{split}.txt").write_text("".join(f" = Article {i} = \n {rng.random()} energy falls \n" * 300 for i in range(n)))
    data = tmp_path / "data"
    script = (
        "import shutil, sys, time\n"
        "from cem.data import prepare as prep\n"
        "def slow(src, dst, length=0):\n"
        "    while block := src.read(1 << 16):\n"
        "        dst.write(block); time.sleep(0.05)\n"
        "prep.shutil.copyfileobj = slow\n"
        f"prep.prepare('wikitext-2', {str(data)!r}, source={str(shared.parent)!r})\n"
    )
    mid_copy = 0
    for kill in range(5):
        left = set(data.glob("wikitext-2/.*.tmp"))  # what earlier kills left behind
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not set(data.glob("wikitext-2/.*.tmp")) - left and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until a copy has started (a new temp file next to the corpus's name)
        mid_copy += bool(set(data.glob("wikitext-2/.*.tmp")) - left)
        time.sleep(rng.uniform(0.0, 0.3))  # then a random moment inside it
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for split in ("train", "valid", "test"):  # a file at the corpus's name is always whole
            path = data / "wikitext-2" / f"{split}.txt"
            assert not path.exists() or path.read_bytes() == (shared / f"{split}.txt").read_bytes(), (kill, split)
    assert mid_copy == 5  # every kill landed inside a copy
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for split in ("train", "valid", "test"):
        assert (data / "wikitext-2" / f"{split}.txt").read_bytes() == (shared / f"{split}.txt").read_bytes()


def test_offline_download_error_names_the_local_copy(monkeypatch, tmp_path, capsys):
    """No network: the error says how to prepare the corpus from a local copy (--from), in one line."""
    import urllib.error

    def offline(url, dest):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(prep, "download", offline)
    with pytest.raises(OSError, match="cem data prepare tinyshakespeare --from DIR"):
        prep.prepare("tinyshakespeare", tmp_path)
    assert main(["data", "prepare", "tinyshakespeare", "--data-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "--from DIR" in err and "Traceback" not in err
    with pytest.raises(FileNotFoundError, match="--from DIR"):  # a corpus that is missing says so too (tinyshakespeare has its embedded copy)
        load_corpus("tinystories", tmp_path / "empty")
