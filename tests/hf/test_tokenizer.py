"""cem tokenizers as `transformers` tokenizers (`cem.hf.tokenizer`) and the special token ids a checkpoint records."""

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers (pip install -e '.[hf]')")

from cem.data.tokenizers import ByteTokenizer  # noqa: E402
from cem.hf.tokenizer import special_token_ids, to_transformers_tokenizer, transformers_tokenizer  # noqa: E402


def test_the_byte_tokenizer_keeps_its_ids():
    ours = ByteTokenizer()
    theirs = to_transformers_tokenizer(ours)
    text = "energy é\n"
    assert theirs.encode(text) == ours.encode(text) and theirs.decode(ours.encode(text)) == text
    assert theirs.eos_token_id == theirs.pad_token_id == ours.eot_id == 256


def test_conversion_and_ids():
    converted = transformers_tokenizer(ByteTokenizer())
    assert transformers_tokenizer(converted) is converted and transformers_tokenizer(None) is None
    assert special_token_ids(converted, None, 7, None) == {"bos_token_id": 256, "eos_token_id": 7, "pad_token_id": 256}
    assert special_token_ids(None, 1, None, None) == {"bos_token_id": 1, "eos_token_id": None, "pad_token_id": None}


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_special_token_text_is_encoded_as_cem_encodes_it(kind, tmp_path):
    """The text "<|endoftext|>" inside a document is characters, not the end-of-text id, for the run's own
    tokenizer and for its export, also after `AutoTokenizer` reloads the export."""
    from transformers import AutoTokenizer

    from cem.data import load_corpus
    from cem.data.tokenizers import train_bpe

    if kind == "byte":
        ours = ByteTokenizer()
    else:
        (tmp_path / "c").mkdir()
        for split in ("train", "valid", "test"):
            (tmp_path / "c" / f"{split}.txt").write_text("the energy of a layer falls with each step\n" * 200)
        ours = train_bpe(load_corpus(str(tmp_path / "c")), 300, tmp_path / "cache")
    text = "end<|endoftext|>start"
    to_transformers_tokenizer(ours).save_pretrained(tmp_path / "hf")
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert ours.eot_id not in ours.encode(text)
    assert theirs(text)["input_ids"] == ours.encode(text)
    assert theirs.decode(theirs(text)["input_ids"]) == text and theirs.eos_token_id == ours.eot_id
