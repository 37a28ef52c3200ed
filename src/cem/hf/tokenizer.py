"""cem tokenizers as `transformers` tokenizers, for the checkpoints `export_hf` and `export_llama` write,
and the special token ids those checkpoints record."""

from __future__ import annotations

from ..data.tokenizers import EOT_TOKEN, ByteTokenizer, HFTokenizer, Tokenizer


def transformers_tokenizer(tokenizer):
    """`tokenizer` as a checkpoint saves it: a cem tokenizer converted (`to_transformers_tokenizer`), a
    `transformers` tokenizer or None as it is."""
    return to_transformers_tokenizer(tokenizer) if isinstance(tokenizer, Tokenizer) else tokenizer


def save_tokenizer(tokenizer, out, context: int) -> None:
    """Save a `transformers` tokenizer next to a model whose context is `context`: a tokenizer that states no
    maximum length (transformers' 1e30 sentinel) gets the context, so that truncation and pipelines know it."""
    if tokenizer.model_max_length > 1e20:
        tokenizer.model_max_length = context
    tokenizer.save_pretrained(out)


def special_token_ids(tokenizer, bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None) -> dict:
    """bos / eos / pad token ids: those given, the tokenizer's for the others (None without a tokenizer;
    cem models have no special tokens of their own)."""
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    if tokenizer is not None:
        for key in ids:
            if ids[key] is None:
                ids[key] = getattr(tokenizer, key, None)
    return ids


def to_transformers_tokenizer(tokenizer: Tokenizer):
    """A `transformers.PreTrainedTokenizerFast` with the same ids as a cem tokenizer; its end-of-text token
    is the eos (and pad) token. The byte tokenizer becomes a byte-level BPE without merges (ids 0-255 are
    the bytes, 256 is "<|endoftext|>"), so that `AutoTokenizer` reads it without cem. Both encode text as
    cem does: the literal text of a special token is never turned into the special token."""
    import tokenizers as tk
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, ByteTokenizer):
        alphabet = _bytes_to_unicode()
        backend = tk.Tokenizer(tk.models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = tk.decoders.ByteLevel()
        backend.add_special_tokens([tk.AddedToken(EOT_TOKEN, special=True)])
        eot = EOT_TOKEN
    elif isinstance(tokenizer, HFTokenizer):
        backend = tk.Tokenizer.from_str(tokenizer.backend.to_str())
        eot = backend.id_to_token(tokenizer.eot_id)
    else:
        raise ValueError(f"cannot convert a {type(tokenizer).__name__} to a transformers tokenizer")
    # split_special_tokens: the text "<|endoftext|>" in a document is encoded as its characters, as cem's own
    # tokenizers do (`HFTokenizer`, the byte tokenizer); only the id itself marks the end of a text
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eot, pad_token=eot, bos_token=eot, split_special_tokens=True)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
