"""Tests for the byte, trained-BPE and pretrained tokenizers, their caching and save/reload."""

from __future__ import annotations

import json
import sys
import types

import pytest
import tokenizers as hf

from cem.data import EOT_TOKEN, ByteTokenizer, HFTokenizer, get_tokenizer, load_tokenizer

SAMPLE = "Hello, wörld! 日本語 🙂\n\ttabs  and  spaces\n"


def test_byte_tokenizer_round_trip(tmp_path):
    tok = get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("byte", 257, 256)
    ids = tok.encode(SAMPLE)
    assert ids == list(SAMPLE.encode("utf-8"))
    assert tok.decode(ids) == SAMPLE
    assert tok.decode([104, 105, 256, 0xC3]) == "hi" + EOT_TOKEN + "\ufffd"
    assert tok.encode_batch(["a", "é"]) == [[97], [0xC3, 0xA9]]
    assert 256 not in tok.encode(EOT_TOKEN)
    tok.save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_bpe_trains_round_trips_and_is_cached(tiny_corpus, tmp_path, monkeypatch):
    tok = get_tokenizer("bpe:300", tiny_corpus, cache_dir=tmp_path)
    assert isinstance(tok, HFTokenizer)
    assert 257 <= tok.vocab_size <= 300
    assert tok.eot_id == tok.backend.token_to_id(EOT_TOKEN)
    for text in (SAMPLE, tiny_corpus.splits["test"][0]):
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(tiny_corpus.splits["test"][0])) < len(tiny_corpus.splits["test"][0]) / 2
    assert tok.eot_id not in tok.encode("a" + EOT_TOKEN)
    assert tok.decode([tok.eot_id]) == EOT_TOKEN

    (cache,) = tmp_path.iterdir()
    assert cache.name.startswith("bpe300-") and (cache / "tokenizer.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been loaded, not retrained")

    monkeypatch.setattr(hf.trainers, "BpeTrainer", no_training)
    again = get_tokenizer("bpe:300", tiny_corpus, cache_dir=tmp_path)
    assert again.name == tok.name
    assert again.backend.to_str() == tok.backend.to_str()
    assert again.encode_batch([SAMPLE, "the cat"]) == tok.encode_batch([SAMPLE, "the cat"])


def test_bpe_training_says_what_it_reads_in_plain_words(tmp_path, capsys):
    """Issue 61: the message named `.../version7.txt/train`, a path that does not exist, and counted "pieces"."""
    from cem.data import load_corpus

    book = tmp_path / "version7.txt"
    book.write_text("".join(f"speech {i} of the play, and its words.\n\n" for i in range(400)))
    corpus = load_corpus(str(book))
    get_tokenizer("bpe:280", corpus, cache_dir=tmp_path / "cache")
    err = capsys.readouterr().err
    docs = corpus.splits["train"]
    assert f"on the training split of {book} ({len(docs):,} documents, {sum(map(len, docs)):,} characters)" in err
    assert f"{book}/train" not in err and "pieces" not in err


def test_bpe_training_is_deterministic(tiny_corpus, tmp_path):
    first = get_tokenizer("bpe:320", tiny_corpus, cache_dir=tmp_path / "a")
    second = get_tokenizer("bpe:320", tiny_corpus, cache_dir=tmp_path / "b")
    assert first.backend.to_str() == second.backend.to_str()
    assert first.name == second.name
    assert get_tokenizer("bpe:300", tiny_corpus, cache_dir=tmp_path / "a").name != first.name


def test_bpe_uses_default_cache_root(tiny_corpus, monkeypatch, tmp_path):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path))
    get_tokenizer("bpe:300", tiny_corpus)
    assert len(list((tmp_path / "tokenizers").glob("bpe300-*/tokenizer.json"))) == 1


def test_bpe_errors(tiny_corpus):
    with pytest.raises(ValueError, match="pass corpus="):
        get_tokenizer("bpe:300")
    with pytest.raises(ValueError, match="at least 257"):
        get_tokenizer("bpe:100", tiny_corpus)


def test_save_and_reload_trained_tokenizer(tiny_corpus, tmp_path):
    tok = get_tokenizer("bpe:300", tiny_corpus, cache_dir=tmp_path / "cache")
    tok.save(tmp_path / "run")
    for reloaded in (load_tokenizer(tmp_path / "run"), get_tokenizer(str(tmp_path / "run"))):
        assert (reloaded.name, reloaded.eot_id, reloaded.vocab_size) == (tok.name, tok.eot_id, tok.vocab_size)
        assert reloaded.encode(SAMPLE) == tok.encode(SAMPLE)
    with pytest.raises(FileNotFoundError, match="no saved tokenizer"):
        load_tokenizer(tmp_path / "cache")


def _plain_tokenizer_json(tiny_corpus, tmp_path, eos: str) -> hf.Tokenizer:
    backend = hf.Tokenizer(hf.models.BPE())
    backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(vocab_size=280, special_tokens=["<s>", eos], show_progress=False,
                                     initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(tiny_corpus.splits["train"], trainer)
    return backend


def test_pretrained_tokenizer_json_directory(tiny_corpus, tmp_path):
    backend = _plain_tokenizer_json(tiny_corpus, tmp_path, "</s>")
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = get_tokenizer(str(tmp_path))
    assert tok.eot_id == backend.token_to_id("</s>") == 1
    assert tok.name.startswith("hf-")
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<s>"}}))
    assert get_tokenizer(str(tmp_path / "tokenizer.json")).eot_id == 0


def test_pretrained_tokenizer_without_end_of_text(tiny_corpus, tmp_path):
    _plain_tokenizer_json(tiny_corpus, tmp_path, "<sep>").save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="cannot find an end-of-text token"):
        get_tokenizer(str(tmp_path))


def test_unknown_tokenizer_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="unknown tokenizer 'org/model'.*transformers is not installed"):
        get_tokenizer("org/model")


def test_transformers_auto_tokenizer_is_wrapped(tiny_corpus, tmp_path, monkeypatch):
    backend = _plain_tokenizer_json(tiny_corpus, tmp_path, "</s>")
    loaded = []

    def from_pretrained(name):
        loaded.append(name)
        return types.SimpleNamespace(is_fast=True, eos_token_id=1, backend_tokenizer=backend)

    fake = types.SimpleNamespace(AutoTokenizer=types.SimpleNamespace(from_pretrained=from_pretrained))
    monkeypatch.setitem(sys.modules, "transformers", fake)
    tok = get_tokenizer("org/model")
    assert loaded == ["org/model"] and tok.eot_id == 1
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
