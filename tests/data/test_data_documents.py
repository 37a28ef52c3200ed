"""Issue 38, item 3: documents inside large files, read incrementally; warnings for thin splits; --encoding."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from cem.cli import main
from cem.data import load_corpus
from cem.data import local
from cem.data.local import cut_documents, text_documents
from cem.data.stream import open_streams
from cem.data.tokenshards import prepare_shards

SPLITS = ("train", "valid", "test")


def _paragraphs(n: int, start: int = 0) -> list[str]:
    return [f"paragraph {i}\nits second line" for i in range(start, start + n)]


def _docs(corpus) -> list[str]:
    return sorted(d for s in SPLITS for d in corpus.splits[s])


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64, 10_000])
def test_documents_do_not_depend_on_how_the_text_is_read(chunk):
    text = "\n".join(f"p{i} a\nb" + ("\n \n\n" if i % 2 else "\n\n") for i in range(200)) + "\n\n"
    whole = [p for p in local._BLANK_LINES.split(text) if p.strip()]
    assert len(whole) == 200
    assert list(cut_documents(text[i : i + chunk] for i in range(0, len(text), chunk))) == whole
    sep = "<|endoftext|>"
    joined = sep.join(whole)
    assert list(cut_documents((joined[i : i + chunk] for i in range(0, len(joined), chunk)), sep)) == whole


def test_a_stretch_without_separator_is_cut_at_line_ends(monkeypatch):
    monkeypatch.setattr(local, "MAX_DOC_CHARS", 100)
    text = "".join(f"line {i:03d} of one long paragraph\n" for i in range(40))  # 32 characters a line
    docs = list(cut_documents(text[i : i + 7] for i in range(0, len(text), 7)))
    assert "".join(docs) == text and len(docs) == 14
    assert all(len(d) <= 100 and d.endswith("\n") for d in docs)


@pytest.mark.slow
def test_a_large_file_is_read_in_bounded_memory(tmp_path):
    """The old reader held the whole file (and its text) at once; documents now cost a chunk and one document."""
    path = tmp_path / "big.txt"
    block = "\n\n".join(_paragraphs(2000)) + "\n\n"
    path.write_text(block * 200)  # 12 MB
    tracemalloc.start()
    try:
        n = sum(1 for _ in text_documents(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 400_000 and path.stat().st_size > 10_000_000
    assert peak < 6 * local.READ_BYTES, f"peak {peak:,} bytes for a {path.stat().st_size:,}-byte file"


def test_a_large_file_in_a_folder_is_cut_and_split_sensibly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(local, "MAX_DOC_CHARS", 10_000)  # "large": more than this many bytes
    (tmp_path / "big.txt").write_text("\n\n".join(_paragraphs(1000)))
    corpus = load_corpus(str(tmp_path))
    assert _docs(corpus) == sorted(_paragraphs(1000))
    assert {s: len(corpus.splits[s]) for s in SPLITS} == {"train": 980, "valid": 10, "test": 10}
    assert "warning" not in capsys.readouterr().err  # one file only: nothing to warn about
    streams = open_streams(str(tmp_path))
    streamed = {s: list(streams(s)) for s in SPLITS}
    assert sorted(d for s in SPLITS for d in streamed[s]) == sorted(_paragraphs(1000))
    assert all(len(streamed[s]) >= 3 for s in ("valid", "test"))


def test_prepare_of_a_folder_holding_one_large_file(tmp_path, monkeypatch):
    """It tokenised the file as one document, then failed with "the valid split has no text"."""
    monkeypatch.setattr(local, "MAX_DOC_CHARS", 10_000)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.txt").write_text("\n\n".join(_paragraphs(2000)))
    out = prepare_shards(str(tmp_path / "src"), "byte", tmp_path / "shards", workers=0, progress=False)
    assert (out / "valid-00000.bin").stat().st_size > 0 and (out / "test-00000.bin").stat().st_size > 0


def test_separator_cuts_every_txt_file(tmp_path, capsys):
    texts = [f"story {i}\n\nwith a blank line inside" for i in range(300)]
    (tmp_path / "a.txt").write_text("<|endoftext|>".join(texts[:150]))
    (tmp_path / "b.txt").write_text("<|endoftext|>".join(texts[150:]))
    corpus = local.load_local(tmp_path, separator="<|endoftext|>")
    assert _docs(corpus) == sorted(texts)
    streams = open_streams(str(tmp_path), separator="<|endoftext|>")
    assert sorted(d for s in SPLITS for d in streams(s)) == sorted(texts)
    with pytest.raises(ValueError, match="has 2 document"):  # without it each (small) file is one document
        load_corpus(str(tmp_path))
    assert main(["data", "prepare", str(tmp_path), "--tokenizer", "byte", "--doc-separator", "", "--out", str(tmp_path / "o")]) == 2
    assert "--doc-separator is empty" in capsys.readouterr().err
    argv = ["data", "prepare", str(tmp_path), "--tokenizer", "byte", "--workers", "0", "--out", str(tmp_path / "s")]
    assert main([*argv, "--doc-separator", "<|endoftext|>"]) == 0
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["settings"]["separator"] == "<|endoftext|>"


def test_a_split_of_few_documents_is_warned_about(tmp_path, capsys):
    for i in range(16):
        (tmp_path / f"{i:02d}.txt").write_text(f"file {i}\n")
    corpus = load_corpus(str(tmp_path))
    err = capsys.readouterr().err.splitlines()
    assert [len(corpus.splits[s]) for s in ("valid", "test")] == [1, 1]
    assert err == [f"warning: {tmp_path}: the {s} split has only 1 document; give more documents (or --doc-separator "
                   "to cut files into more) or train/valid/test files" for s in ("valid", "test")]
    streams = open_streams(str(tmp_path))
    assert all(list(streams(s)) == corpus.splits[s] for s in SPLITS)  # the stream ranks such a folder as load_corpus does
    assert capsys.readouterr().err.splitlines() == err


def test_a_split_from_one_file_of_several_is_warned_about(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(local, "MAX_DOC_CHARS", 10_000)
    (tmp_path / "big.txt").write_text("\n\n".join(_paragraphs(1000)))
    for i in range(3):
        (tmp_path / f"small{i}.txt").write_text(f"a small file {i}\n")
    corpus = load_corpus(str(tmp_path))
    err = capsys.readouterr().err
    for s in ("valid", "test"):
        assert all(d.startswith("paragraph") for d in corpus.splits[s])
        assert f"the {s} split has all its 10 documents from one file (big.txt) of 4" in err
    assert "train split" not in err


def test_the_encoding_error_names_the_flag_of_the_command(tmp_path, capsys):
    (tmp_path / "latin.txt").write_bytes("".join(f"caf\xe9 {i}\n\n" for i in range(1000)).encode("latin-1"))
    argv = ["data", "prepare", str(tmp_path / "latin.txt"), "--tokenizer", "byte", "--workers", "0"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "latin.txt is not utf-8 text (byte 3: b'\\xe9'); give its encoding with --encoding NAME" in err
    assert main([*argv, "--out", str(tmp_path / "b"), "--encoding", "latin-1"]) == 0
    with pytest.raises(ValueError, match="give its encoding with --data-encoding NAME"):  # cem train's flag
        load_corpus(str(tmp_path / "latin.txt"))
    assert main([*argv, "--out", str(tmp_path / "c"), "--encoding", "nonesuch"]) == 2
    assert "unknown encoding 'nonesuch'" in capsys.readouterr().err


def test_an_undecodable_byte_is_named_across_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "READ_BYTES", 4)
    (tmp_path / "x.txt").write_bytes("abc\n\n\u00e9\u00e9\n\nok".encode("utf-8") + b"\xff")  # an \u00e9 spans two reads
    with pytest.raises(ValueError, match=r"x.txt is not utf-8 text \(byte 13: b'\\xff'\)"):
        list(text_documents(tmp_path / "x.txt"))



def test_a_codec_that_refuses_the_whole_text_names_the_file_and_the_setting(tmp_path):
    """Issue 63: data_encoding=utf-16 on a UTF-8 file was "UTF-16 stream does not start with BOM" (a UnicodeError
    that is no UnicodeDecodeError, from the decoder reading the file in pieces), naming neither the file nor the setting."""
    (tmp_path / "u8.txt").write_text("hello world\n" * 300)
    with pytest.raises(ValueError, match=r"u8.txt is not utf-16 text \(byte 0: b'h'\); give its encoding with --data-encoding NAME"):
        list(text_documents(tmp_path / "u8.txt", "utf-16"))
