"""Uses that must work (issue 12, item 6) and the layers' input checks."""

import pytest
import torch

from cem.data import load_corpus
from cem.data.local import MIN_PARAGRAPHS
from cem.layers import CEMAttention


def test_a_single_txt_file_is_split_by_paragraphs_or_lines(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i} of a plain text file\n" for i in range(300)))
    corpus = load_corpus(str(lines))
    assert sum(len(corpus.splits[s]) for s in ("train", "valid", "test")) == 300
    assert all(corpus.splits[s] for s in ("train", "valid", "test"))
    paragraphs = tmp_path / "paras.txt"
    paragraphs.write_text("\n\n".join(f"paragraph {i}\nsecond line" for i in range(MIN_PARAGRAPHS * 5)))
    corpus = load_corpus(str(paragraphs))
    docs = [d for s in ("train", "valid", "test") for d in corpus.splits[s]]
    assert len(docs) == MIN_PARAGRAPHS * 5 and all(d.endswith("second line") for d in docs)


def test_latin1_text_needs_its_encoding(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("".join(f"caf\xe9 {i}\n" for i in range(100)).encode("latin-1"))
    with pytest.raises(ValueError, match="latin.txt is not utf-8 text"):
        load_corpus(str(path))
    corpus = load_corpus(str(path), encoding="latin-1")
    assert corpus.encoding == "latin-1" and "\ufffd" not in "".join(corpus.splits["train"])


def test_layers_name_both_dtypes_and_check_energy_shapes():
    layer = CEMAttention(16, 2)
    with pytest.raises(ValueError, match="dtype torch.float32, got torch.float64"):
        layer(torch.randn(1, 4, 16, dtype=torch.float64))
    assert layer.double()(torch.randn(1, 4, 16, dtype=torch.float64)).dtype == torch.float64  # cast the layer: fine
    with pytest.raises(ValueError, match="same shape"):
        layer.energy(torch.randn(1, 4, 16, dtype=torch.float64), torch.randn(1, 5, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="step_size must be a finite number"):
        layer.step_size = float("nan")
