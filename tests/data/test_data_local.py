"""Tests for corpora from local txt/jsonl/parquet files and directories, and `hf:` datasets on local files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cem.data import load_corpus


def _write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)), "utf-8")


def _write_parquet(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), path)


def _all_docs(corpus) -> list[str]:
    return sorted(doc for docs in corpus.splits.values() for doc in docs)


def test_jsonl_file_is_hashed_98_1_1(tmp_path):
    texts = [f"document {i}\n" for i in range(300)]
    _write_jsonl(tmp_path / "docs.jsonl", texts)
    corpus = load_corpus(str(tmp_path / "docs.jsonl"))
    assert {s: len(d) for s, d in corpus.splits.items()} == {"train": 294, "valid": 3, "test": 3}
    assert _all_docs(corpus) == sorted(texts)
    assert load_corpus(str(tmp_path / "docs.jsonl")).splits == corpus.splits


def test_parquet_file(tmp_path):
    texts = [f"row {i}" for i in range(10)]
    _write_parquet(tmp_path / "docs.parquet", texts)
    corpus = load_corpus(str(tmp_path / "docs.parquet"))
    assert {s: len(d) for s, d in corpus.splits.items()} == {"train": 8, "valid": 1, "test": 1}
    assert _all_docs(corpus) == sorted(texts)


def test_directory_of_mixed_files_one_document_per_txt(tmp_path):
    for i in range(3):
        (tmp_path / "sub").mkdir(exist_ok=True)
        (tmp_path / "sub" / f"{i}.txt").write_text(f"text file {i}\nsecond line\n")
    _write_jsonl(tmp_path / "more.jsonl", ["json a", "json b"])
    (tmp_path / "README.md").write_text("ignored")
    corpus = load_corpus(str(tmp_path))
    expected = [f"text file {i}\nsecond line\n" for i in range(3)] + ["json a", "json b"]
    assert _all_docs(corpus) == sorted(expected)
    assert all(corpus.splits[s] for s in ("train", "valid", "test"))


def test_directory_with_split_files(tmp_path):
    (tmp_path / "train.txt").write_text("the training text\n")
    _write_jsonl(tmp_path / "validation.jsonl", ["v1", "v2"])
    _write_parquet(tmp_path / "test.parquet", ["t1"])
    corpus = load_corpus(str(tmp_path))
    assert corpus.splits == {"train": ["the training text\n"], "valid": ["v1", "v2"], "test": ["t1"]}


def test_directory_with_incomplete_split_files(tmp_path):
    (tmp_path / "train.txt").write_text("a")
    (tmp_path / "test.txt").write_text("b")
    with pytest.raises(ValueError, match="found for 'valid': none"):
        load_corpus(str(tmp_path))


def test_too_few_documents(tmp_path):
    (tmp_path / "book.txt").write_text("one long document\n")
    with pytest.raises(ValueError, match="has 1 document.*at least 3"):
        load_corpus(str(tmp_path / "book.txt"))


def test_bad_local_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl is empty"):
        load_corpus(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with a string field 'text'"):
        load_corpus(str(tmp_path / "bad.jsonl"))
    pq.write_table(pa.table({"body": ["a", "b", "c"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="no 'text' column"):
        load_corpus(str(tmp_path / "bad.parquet"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("text\na\n")
    with pytest.raises(ValueError, match="holds no .txt, .jsonl, .parquet files"):
        load_corpus(str(tmp_path / "other"))


def test_hf_local_dataset_with_all_splits(tmp_path):
    _write_jsonl(tmp_path / "ds" / "train.jsonl", [f"train {i}" for i in range(20)])
    _write_jsonl(tmp_path / "ds" / "validation.jsonl", [f"valid {i}" for i in range(5)])
    _write_jsonl(tmp_path / "ds" / "test.jsonl", [f"test {i}" for i in range(5)])
    corpus = load_corpus(f"hf:{tmp_path / 'ds'}", hf_max_docs=4)
    assert corpus.splits == {
        "train": [f"train {i}" for i in range(4)],
        "valid": [f"valid {i}" for i in range(4)],
        "test": [f"test {i}" for i in range(4)],
    }


def test_hf_local_dataset_without_held_out_splits(tmp_path):
    _write_parquet(tmp_path / "ds" / "train.parquet", [f"doc {i}" for i in range(100)])
    corpus = load_corpus(f"hf:{tmp_path / 'ds'}")
    assert {s: len(d) for s, d in corpus.splits.items()} == {"train": 98, "valid": 1, "test": 1}
    assert _all_docs(corpus) == sorted(f"doc {i}" for i in range(100))


def test_hf_local_dataset_with_validation_only_is_halved(tmp_path):
    _write_jsonl(tmp_path / "ds" / "train.jsonl", ["a", "b"])
    _write_jsonl(tmp_path / "ds" / "validation.jsonl", ["v0", "v1", "v2"])
    corpus = load_corpus(f"hf:{tmp_path / 'ds'}")
    assert corpus.splits == {"train": ["a", "b"], "valid": ["v0", "v1"], "test": ["v2"]}


def test_hf_rows_without_text(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="rows need a string field 'text'"):
        load_corpus(f"hf:{tmp_path / 'ds'}")


def test_hf_byte_limit_and_the_default_from_the_budget(tmp_path):
    from cem.training import load_run_config
    from cem.training.budget import HF_BYTES_PER_TOKEN, hf_bytes_for_budget

    _write_jsonl(tmp_path / "ds" / "train.jsonl", [f"train {i:03d}" for i in range(100)])  # 9 bytes each
    _write_jsonl(tmp_path / "ds" / "test.jsonl", [f"test {i}" for i in range(10)])
    corpus = load_corpus(f"hf:{tmp_path / 'ds'}", hf_max_bytes=30)
    assert corpus.splits["train"] == ["train 000", "train 001", "train 002", "train 003"]  # stops at >= 30 bytes
    run = load_run_config(None, [f"data=hf:{tmp_path / 'ds'}", "max_steps=10", "batch_size=2", "seq_len=64"])
    assert hf_bytes_for_budget(run) == HF_BYTES_PER_TOKEN * 10 * 2 * 64
    assert hf_bytes_for_budget(load_run_config(None, ["max_steps=10"])) is None  # not an hf: corpus
