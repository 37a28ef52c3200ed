"""Tests for token shards of a streamed corpus: contents against plain tokenisation, shard sizes, limits,
splits, workers, resume after an interruption and after kill -9, reading across shard boundaries."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cem.data import SequenceSampler, TokenSplit, get_tokenizer, iter_eval_batches
from cem.data import tokenshards
from cem.data.stream import open_streams
from cem.data.tokenizers import bpe_from_texts
from cem.data.tokenshards import ShardedTokens, find_shards, load_shards, prepare_shards, shard_dir

WORDS = "the cat sat on a mat and then ran to its home where café owners said naïve things".split()


def _docs(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) + "\n" for _ in range(n)]


@pytest.fixture
def stream_corpus(tmp_path) -> Path:
    """A folder of .jsonl, .parquet and .txt files without split files (about 250 kB)."""
    rng = random.Random(0)
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for k in range(2):
        with open(root / f"part{k}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in _docs(rng, 400))
    pq.write_table(pa.table({"text": _docs(rng, 400)}), root / "sub" / "rows.parquet", row_group_size=50)
    for k in range(5):
        (root / "sub" / f"page{k}.txt").write_text("".join(_docs(rng, 3)), encoding="utf-8")
    return root


def _expected(source: str, split: str, tokenizer) -> tuple[list[int], int]:
    """The split's tokens by plain, one-document-at-a-time tokenisation, and its UTF-8 bytes."""
    tokens, n_bytes = [], 0
    for doc in open_streams(source)(split):
        tokens += tokenizer.encode(doc) + [tokenizer.eot_id]
        n_bytes += len(doc.encode("utf-8"))
    return tokens, n_bytes


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_shards_hold_the_plain_tokenisation(stream_corpus, tmp_path):
    out = prepare_shards(str(stream_corpus), "byte", tmp_path / "out", shard_tokens=5000, workers=0, progress=False)
    manifest, tokenizer, splits = load_shards(out)
    for split in ("train", "valid", "test"):
        tokens, n_bytes = _expected(str(stream_corpus), split, tokenizer)
        assert splits[split].tokens.tolist() == tokens
        assert splits[split].n_bytes == n_bytes
        sizes = [s["n_tokens"] for s in manifest["splits"][split]["shards"]]
        assert all(n == 5000 for n in sizes[:-1]) and 0 < sizes[-1] <= 5000
    assert len(manifest["splits"]["train"]["shards"]) > 10
    assert splits["train"].tokens.dtype == np.uint16
    assert 0 < splits["valid"].n_tokens < splits["train"].n_tokens / 20  # about 1% of the documents each


def test_bpe_shards_and_uint32_for_a_large_vocabulary(stream_corpus, tmp_path, monkeypatch):
    tokenizer = get_tokenizer("bpe:300", _small_corpus(stream_corpus), cache_dir=tmp_path / "tok")
    tokenizer.save(tmp_path / "bpe")
    out = prepare_shards(str(stream_corpus), str(tmp_path / "bpe"), tmp_path / "out", shard_tokens=3000, workers=0, progress=False)
    _, loaded, splits = load_shards(out)
    assert loaded.name == tokenizer.name
    assert splits["test"].tokens.tolist() == _expected(str(stream_corpus), "test", tokenizer)[0]
    tokenizer.vocab_size = 70_000  # ids still fit; the dtype follows the vocabulary size
    monkeypatch.setattr(tokenshards, "get_tokenizer", lambda spec: tokenizer)
    monkeypatch.setattr(tokenshards, "load_tokenizer", lambda path: tokenizer)
    wide = prepare_shards(str(stream_corpus), "wide", tmp_path / "wide-out", shard_tokens=3000, workers=0, progress=False)
    _, _, wide_splits = load_shards(wide)
    assert wide_splits["test"].tokens.dtype == np.uint32
    assert wide_splits["test"].tokens.tolist() == splits["test"].tokens.tolist()


def test_a_bpe_trained_on_the_leading_documents(stream_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenshards, "BPE_SAMPLE_CHARS", 20_000)
    out = prepare_shards(str(stream_corpus), "bpe:300", tmp_path / "out", shard_tokens=3000, workers=2, progress=False)
    manifest, tokenizer, splits = load_shards(out)
    assert tokenizer.vocab_size == 300 and manifest["settings"]["tokenizer"] == tokenizer.name
    assert manifest["settings"]["bpe_sample_chars"] == 20_000
    assert splits["valid"].tokens.tolist() == _expected(str(stream_corpus), "valid", tokenizer)[0]
    sample = tokenshards._sample(open_streams(str(stream_corpus))("train"), 20_000)
    assert 20_000 <= sum(map(len, sample)) < 21_000  # the leading documents until 20,000 characters
    assert bpe_from_texts(sample, 300, "the sample").name == tokenizer.name  # the BPE of those documents


def _small_corpus(folder: Path):
    from cem.data import load_corpus

    return load_corpus(str(folder))


def test_workers_write_the_same_bytes(stream_corpus, tmp_path):
    a = prepare_shards(str(stream_corpus), "byte", tmp_path / "a", shard_tokens=7000, workers=0, progress=False)
    b = prepare_shards(str(stream_corpus), "byte", tmp_path / "b", shard_tokens=7000, workers=2, progress=False)
    assert _files(a) == _files(b)


def test_token_limits(stream_corpus, tmp_path):
    out = prepare_shards(str(stream_corpus), "byte", tmp_path / "out", tokens=12_345, held_out_tokens=100, shard_tokens=5000,
                         workers=0, progress=False)
    manifest, tokenizer, splits = load_shards(out)
    full, full_bytes = _expected(str(stream_corpus), "train", tokenizer)
    assert splits["train"].tokens.tolist() == full[:12_345]
    assert [s["n_tokens"] for s in manifest["splits"]["train"]["shards"]] == [5000, 5000, 2345]
    assert 0.9 < splits["train"].n_bytes / 12_345 < 1.0  # bytes of the text taken (a cut document in proportion)
    assert splits["valid"].n_tokens == splits["test"].n_tokens == 100


def test_default_held_out_share(stream_corpus, tmp_path):
    out = prepare_shards(str(stream_corpus), "byte", tmp_path / "out", tokens=2000, shard_tokens=5000, workers=0, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["tokens"] == {"train": 2000, "valid": 1_000_000, "test": 1_000_000}


def test_split_files_and_hf_datasets(tmp_path):
    rng = random.Random(1)
    docs = {split: _docs(rng, n) for split, n in (("train", 50), ("validation", 9), ("test", 7))}
    (tmp_path / "ds").mkdir()
    for split, split_docs in docs.items():
        with open(tmp_path / "ds" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in split_docs)
    tokenizer = get_tokenizer("byte")
    for source in (str(tmp_path / "ds"), f"hf:{tmp_path / 'ds'}"):
        out = prepare_shards(source, "byte", tmp_path / source.replace("/", "_"), shard_tokens=10**6, workers=0, tokens=10**6,
                             progress=False)
        _, _, splits = load_shards(out)
        for split, name in (("train", "train"), ("valid", "validation"), ("test", "test")):
            want = [t for d in docs[name] for t in tokenizer.encode(d) + [tokenizer.eot_id]]
            assert splits[split].tokens.tolist() == want, (source, split)
    (tmp_path / "ds" / "test.jsonl").unlink()  # one held-out split: even documents valid, odd ones test
    hf = f"hf:{tmp_path / 'ds'}"
    assert list(open_streams(hf)("valid")) == docs["validation"][0::2]
    assert list(open_streams(hf)("test")) == docs["validation"][1::2]


def test_bad_requests(stream_corpus, tmp_path):
    with pytest.raises(ValueError, match="--tokens N"):
        prepare_shards("hf:some/corpus", "byte", tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match="held_out_tokens must be positive, got 0"):
        prepare_shards(str(stream_corpus), "byte", tmp_path / "o", held_out_tokens=0, progress=False)
    with pytest.raises(ValueError, match="need at least 257 symbols"):
        prepare_shards(str(stream_corpus), "bpe:200", tmp_path / "o", progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_shards(str(tmp_path / "nothing"), "byte", tmp_path / "o", progress=False)
    prepare_shards(str(stream_corpus), "byte", tmp_path / "o", tokens=1000, shard_tokens=500, workers=0, progress=False)
    with pytest.raises(ValueError, match=r"other settings \(shard_tokens differ\)"):
        prepare_shards(str(stream_corpus), "byte", tmp_path / "o", tokens=1000, shard_tokens=400, workers=0, progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / ".notes.tmp").write_text("not a prepare's")
    with pytest.raises(ValueError, match="is not empty and holds no token shards"):
        prepare_shards(str(stream_corpus), "byte", tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / ".notes.tmp").is_file()
    (tmp_path / "link").symlink_to(tmp_path / "o")
    with pytest.raises(ValueError, match="symbolic link"):
        prepare_shards(str(stream_corpus), "byte", tmp_path / "link", progress=False)


@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_interrupted_prepare_continues_to_the_same_bytes(tokenizer, stream_corpus, tmp_path, monkeypatch):
    kw = dict(tokens=20_000, held_out_tokens=3000, shard_tokens=3000, workers=0, progress=False)
    whole = prepare_shards(str(stream_corpus), tokenizer, tmp_path / "whole", **kw)
    real_record, calls = tokenshards._record, []

    def record_then_stop(*args):
        real_record(*args)
        calls.append(args[2])
        if len(calls) in (2, 8):  # in train, then in valid
            raise KeyboardInterrupt

    monkeypatch.setattr(tokenshards, "_record", record_then_stop)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            prepare_shards(str(stream_corpus), tokenizer, tmp_path / "cut", **kw)
    manifest = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["splits"]["valid"]["shards"]
    with pytest.raises(ValueError, match="unfinished"):
        load_shards(tmp_path / "cut")
    prepare_shards(str(stream_corpus), tokenizer, tmp_path / "cut", **kw)
    assert _files(tmp_path / "cut") == _files(whole)


def test_an_hf_prepare_resumes_from_the_dataset_position(tmp_path, monkeypatch):
    """An interrupted prepare of an hf: dataset reopens its train split where the last shard's batch began
    (datasets' IterableDataset.load_state_dict), instead of reading the documents before it again."""
    import datasets

    rng = random.Random(3)
    (tmp_path / "ds").mkdir()
    for name, n in (("train-0", 300), ("train-1", 300), ("train-2", 300), ("validation", 40), ("test", 40)):
        with open(tmp_path / "ds" / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in _docs(rng, n))
    monkeypatch.setattr(tokenshards, "TASK_CHARS", 2000)
    source, kw = f"hf:{tmp_path / 'ds'}", dict(tokens=10**6, shard_tokens=9000, workers=0, progress=False)
    whole = prepare_shards(source, "byte", tmp_path / "whole", **kw)
    assert not (whole / "resume.json").exists()
    real_record, real_load, loaded = tokenshards._record, datasets.IterableDataset.load_state_dict, []

    def record_then_stop(*args):
        real_record(*args)
        if len(args[1]["splits"]["train"]["shards"]) == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(tokenshards, "_record", record_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(source, "byte", tmp_path / "cut", **kw)
    position = json.loads((tmp_path / "cut" / "resume.json").read_text())["train"]
    assert position["doc"] > 300 and position["position"] is not None  # in the second file
    monkeypatch.setattr(tokenshards, "_record", real_record)
    monkeypatch.setattr(datasets.IterableDataset, "load_state_dict", lambda self, state: loaded.append(state) or real_load(self, state))
    prepare_shards(source, "byte", tmp_path / "cut", **kw)
    assert loaded == [position["position"]]
    assert _files(tmp_path / "cut") == _files(whole)


KILL_SCRIPT = """
import sys
from cem.data.tokenshards import prepare_shards
prepare_shards(sys.argv[1], "byte", sys.argv[2], shard_tokens=20_000, workers=int(sys.argv[3]), progress=False)
"""


@pytest.mark.slow
def test_kill_9_mid_prepare_then_rerun_gives_the_same_shards(tmp_path):
    rng = random.Random(2)
    corpus = tmp_path / "big"
    corpus.mkdir()
    for k in range(4):
        with open(corpus / f"part{k}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in _docs(rng, 2500))  # about 3 MB in all
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = lambda out, workers: subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(corpus), str(out), str(workers)], env=env)  # noqa: E731
    assert run(tmp_path / "whole", 0).wait() == 0
    proc = run(tmp_path / "cut", 1)
    manifest = tmp_path / "cut" / "manifest.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if manifest.is_file() and len(json.loads(manifest.read_text())["splits"].get("train", {}).get("shards", [])) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the prepare ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads(manifest.read_text())
    assert not state["complete"] and not state["splits"]["train"]["done"]
    assert run(tmp_path / "cut", 2).wait() == 0
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


def test_sharded_tokens_slice_like_one_array(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [5, 1, 7, 3]
    whole = rng.integers(0, 1000, sum(sizes)).astype(np.uint16)
    paths, start = [], 0
    for k, n in enumerate(sizes):
        paths.append(tmp_path / f"s{k}.bin")
        whole[start : start + n].tofile(paths[-1])
        start += n
    tokens = ShardedTokens(paths, sizes, np.uint16)
    assert len(tokens) == len(whole)
    for a in range(len(whole) + 1):
        for b in range(a, len(whole) + 2):
            assert np.array_equal(tokens[a:b], whole[a:b])
    assert np.array_equal(tokens[-4:], whole[-4:]) and tokens.tolist() == whole.tolist()
    with pytest.raises(TypeError):
        tokens[3]


def test_sampler_and_ranks_on_shards_equal_one_array(stream_corpus, tmp_path):
    out = prepare_shards(str(stream_corpus), "byte", tmp_path / "out", shard_tokens=999, workers=0, progress=False)
    _, _, splits = load_shards(out)
    sharded = splits["train"]
    flat = TokenSplit("flat", np.array(sharded.tokens.tolist(), dtype=np.uint16), sharded.n_bytes)
    one = SequenceSampler(flat, 64, seed=3)
    ranks = [SequenceSampler(sharded, 64, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(30):  # several epochs of 20 windows... and windows crossing shard boundaries
        x, y = one.next_batch(8)
        parts = [s.next_batch(4) for s in ranks]
        assert torch_equal(x, parts[0][0], parts[1][0]) and torch_equal(y, parts[0][1], parts[1][1])
    eval_flat = list(iter_eval_batches(flat.tokens, 64, 4))
    eval_sharded = list(iter_eval_batches(sharded.tokens, 64, 4))
    assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(eval_flat, eval_sharded))
    assert len(eval_flat) == len(eval_sharded)


def torch_equal(whole, first, second) -> bool:
    import torch

    return torch.equal(whole, torch.cat([first, second]))


def test_find_shards(stream_corpus, tmp_path):
    data_dir = tmp_path / "data"
    source = str(stream_corpus)
    assert find_shards(source, "byte", data_dir) is None
    out = prepare_shards(source, "byte", shard_tokens=5000, workers=0, data_dir=data_dir, progress=False)
    assert out == shard_dir(source, "byte", data_dir) and out.parent == data_dir / "shards"
    assert find_shards(source, "byte", data_dir) == out
    assert find_shards(str(out), "byte") == out
    with pytest.raises(ValueError, match="train with --tokenizer byte"):
        find_shards(str(out), "gpt2")
    assert find_shards("hf:some/corpus", "byte", data_dir, budget_bytes=10**6) is None  # small: loaded whole
    with pytest.raises(ValueError, match="prepare token shards first: cem data prepare hf:some/corpus --tokenizer byte --tokens"):
        find_shards("hf:some/corpus", "byte", data_dir, budget_bytes=4 * 10**9)
