"""Tests for token shards: layout, caching, atomic writes, dtype choice, and piecewise tokenisation."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pytest

from cem.data import Corpus, Tokenizer, build_split, get_tokenizer, token_cache_dir
from cem.data import shards
from cem.data.chunking import pieces


class OffsetTokenizer(Tokenizer):
    """Test tokenizer: character code + offset, with a configurable vocabulary size."""

    def __init__(self, offset: int, vocab_size: int) -> None:
        self.offset, self.vocab_size = offset, vocab_size
        self.eot_id = vocab_size - 1
        self.name = f"offset{offset}-{vocab_size}"

    def encode(self, text: str) -> list[int]:
        return [ord(c) + self.offset for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(chr(i - self.offset) for i in ids)

    def save(self, directory) -> None:
        raise NotImplementedError


def _expected_tokens(corpus: Corpus, tok: Tokenizer, split: str) -> list[int]:
    return [t for doc in corpus.splits[split] for t in tok.encode(doc) + [tok.eot_id]]


def test_byte_shard_layout_and_meta(tiny_corpus, tmp_path):
    tok = get_tokenizer("byte")
    split = build_split(tiny_corpus, tok, "train", cache_dir=tmp_path)
    assert split.name == "tiny/train"
    assert split.tokens.dtype == np.uint16
    assert split.tokens.tolist() == _expected_tokens(tiny_corpus, tok, "train")
    assert split.n_tokens == tiny_corpus.n_bytes("train") + len(tiny_corpus.splits["train"])
    assert split.n_bytes == tiny_corpus.n_bytes("train")
    meta = json.loads((tmp_path / "train.json").read_text())
    assert meta["n_tokens"] == split.n_tokens and meta["tokenizer"] == "byte" and meta["dtype"] == "uint16"
    assert meta["corpus_fingerprint"] == tiny_corpus.fingerprint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "train.json"]


def test_bpe_shard_matches_encoding(tiny_corpus, tmp_path):
    tok = get_tokenizer("bpe:300", tiny_corpus, cache_dir=tmp_path / "tok")
    split = build_split(tiny_corpus, tok, "valid", cache_dir=tmp_path / "shards")
    assert split.tokens.tolist() == _expected_tokens(tiny_corpus, tok, "valid")


def test_second_build_uses_cache(tiny_corpus, tmp_path, monkeypatch):
    tok = get_tokenizer("byte")
    first = build_split(tiny_corpus, tok, "test", cache_dir=tmp_path)
    monkeypatch.setattr(tok, "encode_batch", lambda texts: pytest.fail("cached shard was re-tokenised"))
    second = build_split(tiny_corpus, tok, "test", cache_dir=tmp_path)
    assert isinstance(second.tokens, np.memmap)
    assert np.array_equal(first.tokens, second.tokens)


def test_stale_or_truncated_shard_is_rebuilt(tiny_corpus, tmp_path):
    tok = get_tokenizer("byte")
    expected = build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist()
    with open(tmp_path / "train.bin", "r+b") as f:
        f.truncate(10)
    assert build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist() == expected
    changed = Corpus("tiny", {**tiny_corpus.splits, "train": ["other text"]})
    rebuilt = build_split(changed, tok, "train", cache_dir=tmp_path)
    assert rebuilt.tokens.tolist() == _expected_tokens(changed, tok, "train")


@pytest.mark.parametrize("damage", ["zeroed", "meta not JSON", "meta a list"])
def test_a_damaged_cache_of_the_right_size_is_rebuilt(tiny_corpus, tmp_path, damage):
    """A `.bin` zeroed (or edited) in place keeps its size: its checksum, not its size, tells; a damaged
    `.json` is a cache miss, not an error."""
    tok = get_tokenizer("byte")
    expected = build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist()
    if damage == "zeroed":
        size = (tmp_path / "train.bin").stat().st_size
        (tmp_path / "train.bin").write_bytes(bytes(size))
    else:
        (tmp_path / "train.json").write_text("{" if damage == "meta not JSON" else "[]")
    assert build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist() == expected


def test_interrupted_build_leaves_nothing_behind(tiny_corpus, tmp_path, monkeypatch):
    tok = get_tokenizer("byte")
    calls = []

    def failing_encode_batch(texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [list(t.encode()) for t in texts]

    monkeypatch.setattr(shards, "BATCH_CHARS", 1000)
    monkeypatch.setattr(tok, "encode_batch", failing_encode_batch)
    with pytest.raises(KeyboardInterrupt):
        build_split(tiny_corpus, tok, "train", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist() == _expected_tokens(
        tiny_corpus, tok, "train"
    )


def test_batched_tokenisation_equals_one_pass(tiny_corpus, tmp_path, monkeypatch):
    tok = get_tokenizer("byte")
    monkeypatch.setattr(shards, "BATCH_CHARS", 700)
    assert build_split(tiny_corpus, tok, "train", cache_dir=tmp_path).tokens.tolist() == _expected_tokens(
        tiny_corpus, tok, "train"
    )


@pytest.mark.parametrize(
    "vocab_size, dtype", [(65_536, np.uint16), (65_537, np.uint32), (200_000, np.uint32)]
)
def test_dtype_follows_vocab_size(tmp_path, vocab_size, dtype):
    corpus = Corpus("c", {"train": ["héllo"], "valid": ["b"], "test": ["c"]})
    tok = OffsetTokenizer(offset=vocab_size - 300, vocab_size=vocab_size)
    split = build_split(corpus, tok, "train", cache_dir=tmp_path)
    assert split.tokens.dtype == dtype
    assert split.tokens.tolist() == _expected_tokens(corpus, tok, "train")


def test_out_of_range_ids_are_rejected(tmp_path):
    corpus = Corpus("c", {"train": ["z"], "valid": ["b"], "test": ["c"]})
    with pytest.raises(ValueError, match=r"ids outside \[0, 100\)"):
        build_split(corpus, OffsetTokenizer(offset=0, vocab_size=100), "train", cache_dir=tmp_path)


def test_token_cache_dir_default(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path))
    byte_dir = token_cache_dir(tiny_corpus, get_tokenizer("byte"))
    assert byte_dir.parent == tmp_path / "tokens"
    assert byte_dir.name.startswith(tiny_corpus.fingerprint()[:16] + "-")
    assert token_cache_dir(tiny_corpus, OffsetTokenizer(0, 300)) != byte_dir
    build_split(tiny_corpus, get_tokenizer("byte"), "valid")
    assert (byte_dir / "valid.bin").is_file()


def test_unknown_split(tiny_corpus):
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        build_split(tiny_corpus, get_tokenizer("byte"), "dev")


def test_pieces_cut_after_newlines():
    text = "aaaa\nbb\ncccccccccc\nd"
    parts = list(pieces(text, max_chars=6))
    assert "".join(parts) == text
    assert parts == ["aaaa\n", "bb\n", "cccccc", "cccc\nd"]
    assert list(pieces("short", max_chars=6)) == ["short"]


def test_long_documents_are_tokenised_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "pieces", lambda text: pieces(text, max_chars=8))
    corpus = Corpus("c", {"train": ["line one\nline two\nline three\n", "x"], "valid": ["b"], "test": ["c"]})
    tok = get_tokenizer("byte")
    split = build_split(corpus, tok, "train", cache_dir=tmp_path)
    assert split.tokens.tolist() == _expected_tokens(corpus, tok, "train")
