"""Fixtures for the data-layer tests: isolated cache/data dirs, the shared corpora, small corpora."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cem.data import Corpus

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point $CEM_CACHE_DIR at a fresh directory and clear $CEM_DATA_DIR."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path_factory.mktemp("cem-cache")))
    monkeypatch.delenv("CEM_DATA_DIR", raising=False)


@pytest.fixture
def shared_data() -> Path:
    """The shared corpora directory (../shared/data from the repo root); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("no shared corpora beside the checkout (../shared/data); these tests read the real corpora from there")
    return SHARED_DATA


@pytest.fixture
def tiny_corpus() -> Corpus:
    """A small deterministic corpus (~15 kB of pseudo-random words, some non-ASCII)."""
    rng = random.Random(0)
    vocab = "the cat sat on a mat and then ran to its home where café owners said naïve things".split()
    docs = [" ".join(rng.choice(vocab) for _ in range(60)) + ".\n" for _ in range(40)]
    return Corpus("tiny", {"train": docs[:-4], "valid": docs[-4:-2], "test": docs[-2:]})


WORDS = "the cat sat on a mat and then ran to its home where café owners said naïve things".split()


@pytest.fixture
def jsonl_corpus(tmp_path):
    """`make(files, docs, seed)`: a folder tmp_path/corpus of `files` .jsonl files of `docs` documents each (3-60 random
    words; about 70 bytes a document)."""

    def make(files: int, docs: int, seed: int) -> Path:
        rng = random.Random(seed)
        root = tmp_path / "corpus"
        root.mkdir()
        for k in range(files):
            with open(root / f"part{k}.jsonl", "w", encoding="utf-8") as f:
                for _ in range(docs):
                    f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) + "\n"}) + "\n")
        return root

    return make
