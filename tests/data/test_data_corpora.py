"""Tests for corpus loading: named corpora, the embedded ones' determinism, Corpus itself, error messages."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cem.data import KNOWN_CORPORA, Corpus, CorpusSpec, load_corpus, parse_corpus, prepared_data_dir, resolve_data_dir
from cem.data import named
from cem.training import TrainConfig


def test_resolve_data_dir_prefers_argument_then_env_then_default(monkeypatch, tmp_path):
    monkeypatch.setenv("CEM_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.delenv("CEM_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    assert resolve_data_dir() == prepared_data_dir()  # no ./data: where `cem data prepare` writes
    (tmp_path / "data" / "wikitext-2").mkdir(parents=True)
    assert resolve_data_dir(corpus="wikitext-2") == Path("data")
    assert resolve_data_dir(corpus="tinystories") == prepared_data_dir()


def test_corpus_requires_the_three_splits_with_text():
    with pytest.raises(ValueError, match="splits must be exactly"):
        Corpus("x", {"train": ["a"], "valid": ["b"]})
    with pytest.raises(ValueError, match="split 'test' is empty"):
        Corpus("x", {"train": ["a"], "valid": ["b"], "test": [""]})


def test_corpus_bytes_and_fingerprint():
    corpus = Corpus("x", {"train": ["café", "ab"], "valid": ["b"], "test": ["c"]})
    assert corpus.n_bytes("train") == 7
    assert Corpus("x", corpus.splits, encoding="latin-1").n_bytes("train") == 6
    same = Corpus("y", {"train": ["café", "ab"], "valid": ["b"], "test": ["c"]})
    assert corpus.fingerprint() == same.fingerprint()
    for changed in (["café", "ac"], ["caféa", "b"], ["café", "ab", ""]):
        assert Corpus("x", {**corpus.splits, "train": changed}).fingerprint() != corpus.fingerprint()
    swapped = Corpus("x", {"train": ["café", "ab"], "valid": ["c"], "test": ["b"]})
    assert swapped.fingerprint() != corpus.fingerprint()


def test_shakespeare_is_the_embedded_default_with_fixed_splits():
    """Issue 38, item 4: a default corpus that does not move with the Python version, with valid and test
    of many documents of the same kind as train."""
    assert TrainConfig().data == "shakespeare" and {"shakespeare", "python-stdlib"} <= set(KNOWN_CORPORA)
    corpus = load_corpus("shakespeare")
    assert {s: len(d) for s, d in corpus.splits.items()} == {"train": 651, "valid": 36, "test": 36}
    assert corpus.fingerprint() == "2b11409c492ff11fe2077127a5e640164ba786d4917c5d69e712fe8e39c94a19"
    docs = [d for s in ("train", "valid", "test") for d in corpus.splits[s]]
    assert sum(map(len, docs)) == 1_115_394 and sum(not d.endswith("\n\n") for d in docs) == 1  # the text's end
    speakers = re.compile(r"^\n?[A-Z][A-Za-z ,&]*:\n", re.MULTILINE)  # every document is a run of speeches
    assert sum(len(speakers.findall(d)) < 5 for d in docs) <= 1  # the last may hold fewer speeches
    for split in ("valid", "test"):
        assert 50_000 < corpus.n_bytes(split) < 70_000


def test_the_embedded_shakespeare_is_tiny_shakespeare_with_its_notice(shared_data):
    package = Path(named.__file__).parent / "embedded"
    text = gzip.decompress((package / "shakespeare.txt.gz").read_bytes())
    assert text == (shared_data / "tinyshakespeare" / "input.txt").read_bytes()
    assert hashlib.sha256(text).hexdigest() == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    notice = (package / "NOTICE").read_text()
    assert "public domain" in notice and "MIT" in notice and "karpathy/char-rnn" in notice


def test_stdlib_paths_skip_excluded_directories(tmp_path):
    for rel in ["b.py", "a/x.py", "a/notes.txt", "site-packages/m.py", "test/t.py", "a/tests/t.py",
                "idlelib/i.py", "lib2to3/l.py", "__pycache__/c.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("pass\n")
    assert named.stdlib_paths(tmp_path) == ["a/x.py", "b.py"]


def test_python_stdlib_splits_are_nonempty_and_capped():
    corpus = load_corpus("python-stdlib")
    sizes = {s: len(docs) for s, docs in corpus.splits.items()}
    n = sum(sizes.values())
    assert min(sizes.values()) >= 1
    assert 0.93 < sizes["train"] / n < 0.98
    assert 1_000_000 < sum(corpus.n_bytes(s) for s in sizes) <= named.STDLIB_MAX_BYTES
    root = Path(sysconfig.get_paths()["stdlib"])
    expected_files, total = 0, 0
    for rel in named.stdlib_paths(root):
        total += (root / rel).stat().st_size
        if total > named.STDLIB_MAX_BYTES:
            break
        expected_files += 1
    assert n == expected_files


_FINGERPRINT_SCRIPT = (
    "import json; from cem.data import load_corpus; c = load_corpus('python-stdlib'); "
    "print(json.dumps([c.fingerprint(), {s: [d[:80] for d in v] for s, v in c.splits.items()}]))"
)


def test_python_stdlib_is_identical_across_processes():
    corpus = load_corpus("python-stdlib")
    expected = [corpus.fingerprint(), {s: [d[:80] for d in v] for s, v in corpus.splits.items()}]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == expected


def test_wikitext2_articles(shared_data):
    corpus = load_corpus("wikitext-2", shared_data)
    assert {s: len(d) for s, d in corpus.splits.items()} == {"train": 629, "valid": 60, "test": 62}
    for split, size in {"train": 10_797_148, "valid": 1_121_681, "test": 1_256_449}.items():
        text = (shared_data / "wikitext-2" / f"{split}.txt").read_text("utf-8")
        assert "".join(corpus.splits[split]) == text
        assert corpus.n_bytes(split) == size
    assert corpus.splits["train"][0].startswith(" \n = Valkyria Chronicles III = \n")
    assert all(doc.startswith(" = ") and not doc.startswith(" = = ") for doc in corpus.splits["train"][1:])


def test_tinyshakespeare_90_5_5(shared_data):
    corpus = load_corpus("tinyshakespeare", shared_data)
    assert [len(corpus.splits[s][0]) for s in ("train", "valid", "test")] == [1_003_854, 55_770, 55_770]
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text("utf-8")
    assert "".join(corpus.splits[s][0] for s in ("train", "valid", "test")) == text


def test_tinyshakespeare_without_its_file_is_the_embedded_text(tmp_path, monkeypatch):
    """Issue 61: `cem experiment fig2a --scale smoke` failed offline for want of tinyshakespeare/input.txt, whose
    text the package embeds (the same sha256 `cem data prepare` requires of the download): a data directory
    without the file now gives the same corpus from the embedded text; a damaged embedded copy is refused."""
    from cem.data.prepare import TINYSHAKESPEARE_SHA256

    corpus = load_corpus("tinyshakespeare", tmp_path)
    text = "".join(corpus.splits[s][0] for s in ("train", "valid", "test"))
    assert hashlib.sha256(text.encode()).hexdigest() == TINYSHAKESPEARE_SHA256
    assert [len(corpus.splits[s][0]) for s in ("train", "valid", "test")] == [1_003_854, 55_770, 55_770]
    monkeypatch.setattr(named, "_embedded", lambda name: text.replace("First Citizen", "Second Citizen", 1).encode())
    with pytest.raises(ValueError, match="sha256 mismatch"):
        load_corpus("tinyshakespeare", tmp_path)


def test_tinystories_splits(shared_data):
    corpus = load_corpus("tinystories", shared_data)
    directory = shared_data / "tinystories"
    train_text = (directory / "TinyStories-train-first1000.txt").read_text("utf-8")
    held_out = (directory / "TinyStories-validation-head.txt").read_text("utf-8")
    assert "".join(corpus.splits["train"]) == train_text
    assert len(corpus.splits["train"]) == 1102
    assert corpus.splits["train"][1].startswith("Once upon a time, there was a little car named Beep.")
    valid, test = corpus.splits["valid"][0], corpus.splits["test"][0]
    assert valid + test == held_out
    assert valid.endswith("\n\n") and valid.startswith("Spot. Spot saw the shiny car")
    assert abs(valid.count("\n\n") - test.count("\n\n")) <= 1


def _write_fake_enwik8(directory: Path, data: bytes, suffix: str = "") -> None:
    (directory / "enwik8").mkdir(parents=True)
    path = directory / "enwik8" / f"enwik8{suffix}"
    path.write_bytes(gzip.compress(data) if suffix == ".gz" else data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_enwik8_byte_split_with_latin1(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(named, "ENWIK8_SPLIT_BYTES", (90, 5, 5))
    data = bytes(range(156, 256)) if suffix else bytes(i % 256 for i in range(100, 200))
    _write_fake_enwik8(tmp_path, data, suffix)
    corpus = load_corpus("enwik8", tmp_path)
    assert corpus.encoding == "latin-1"
    assert [len(corpus.splits[s][0]) for s in ("train", "valid", "test")] == [90, 5, 5]
    assert [corpus.n_bytes(s) for s in ("train", "valid", "test")] == [90, 5, 5]
    assert "".join(corpus.splits[s][0] for s in ("train", "valid", "test")).encode("latin-1") == data


def test_enwik8_wrong_size(tmp_path, monkeypatch):
    monkeypatch.setattr(named, "ENWIK8_SPLIT_BYTES", (90, 5, 5))
    _write_fake_enwik8(tmp_path, b"x" * 99)
    with pytest.raises(ValueError, match="expected 100 bytes of enwik8, got 99"):
        load_corpus("enwik8", tmp_path)


def test_unknown_corpus_lists_known_names():
    with pytest.raises(ValueError, match="unknown corpus 'wikitext-3'") as info:
        load_corpus("wikitext-3")
    assert all(name in str(info.value) for name in KNOWN_CORPORA)


@pytest.mark.parametrize("name, rel", [("wikitext-2", "wikitext-2/train.txt"),
                                       ("tinystories", "tinystories/TinyStories-train-first1000.txt"),
                                       ("enwik8", "enwik8/enwik8")])
def test_missing_file_says_where_to_put_it(tmp_path, name, rel):
    with pytest.raises(FileNotFoundError) as info:
        load_corpus(name, tmp_path)
    message = str(info.value)
    for part in (str(tmp_path / rel), "--data-dir", "$CEM_DATA_DIR", repr(name)):
        assert part in message
    assert "shared" not in message  # no folder outside the repository


def test_missing_file_uses_env_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "wikitext-2" / "train.txt")):
        load_corpus("wikitext-2")


def test_empty_corpus_file(tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("")
    with pytest.raises(ValueError, match="input.txt is empty"):
        load_corpus("tinyshakespeare", tmp_path)


def test_missing_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("damage", ["cut short", "not gzip"])
def test_a_damaged_gzip_corpus_is_one_error_naming_the_file(tmp_path, monkeypatch, damage):
    """Issue 63: a truncated or non-gzip embedded corpus raised EOFError / "Not a gzipped file", naming nothing."""
    import gzip
    import types

    from cem.data import named

    whole = gzip.compress(b"First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 200)
    data = whole[: len(whole) // 2] if damage == "cut short" else b"plain text, not gzip"
    (tmp_path / "embedded").mkdir()
    (tmp_path / "embedded" / "shakespeare.txt.gz").write_bytes(data)
    monkeypatch.setattr(named, "resources", types.SimpleNamespace(files=lambda package: tmp_path))
    with pytest.raises(ValueError, match=r"the embedded corpus .*shakespeare\.txt\.gz is damaged: not a whole gzip file .*reinstall cem"):
        named.load_shakespeare()
    (tmp_path / "enwik8").mkdir()
    (tmp_path / "enwik8" / "enwik8.gz").write_bytes(data)
    with pytest.raises(ValueError, match=r"enwik8\.gz is damaged: not a whole gzip file .*cem data prepare enwik8"):
        named.load_enwik8(tmp_path)


def test_a_corpus_spec_is_parsed_once_into_one_value(tmp_path):
    """Issue 60: `parse_corpus` is the one reader of a spec (named, local or hf:NAME[:CONFIG]), its errors name the
    spec, a parsed spec passes through unchanged, and the data layer takes it where it takes the text."""
    assert parse_corpus("shakespeare") == CorpusSpec("shakespeare", "named")
    assert parse_corpus(tmp_path / "c.txt") == CorpusSpec(str(tmp_path / "c.txt"), "local")
    hf = parse_corpus("hf:org/data:cfg")
    assert (hf.kind, hf.name, hf.config, hf.label, str(hf), hf.is_hf) == ("hf", "org/data", "cfg", "org/data:cfg", "hf:org/data:cfg", True)
    assert parse_corpus("hf:org/data").config is None and parse_corpus(hf) is hf
    with pytest.raises(ValueError, match=re.escape("expected 'hf:NAME' or 'hf:NAME:CONFIG', got 'hf::cfg'")):
        parse_corpus("hf::cfg")
    with pytest.raises(ValueError, match="unknown corpus kind 'web'"):
        CorpusSpec("x", "web")
    assert parse_corpus("c.txt").resolved() == CorpusSpec(str(Path("c.txt").resolve()), "local")
    assert load_corpus(parse_corpus("shakespeare")).splits == load_corpus("shakespeare").splits


def test_nothing_but_parse_corpus_reads_the_hf_prefix():
    """Issue 60: the spec was parsed in six places (`startswith("hf:")`); the prefix is read in `parse_corpus` only."""
    src = Path(__file__).resolve().parents[2] / "src" / "cem"
    readers = {p.relative_to(src).as_posix() for p in src.rglob("*.py") for line in p.read_text().splitlines()
               if re.search(r"""(startswith|removeprefix|partition)\(\s*(['"]hf:|HF_PREFIX)""", line)}
    assert readers == {"data/corpora.py", "data/corpus.py"}, readers  # `parse_corpus`, and `CorpusSpec.label`
