"""cem tokenizers as `transformers` tokenizers (`cem.hf.tokenizer`) and the special token ids a checkpoint records."""

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers (pip install 'cem-transformers[hf]')")

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
