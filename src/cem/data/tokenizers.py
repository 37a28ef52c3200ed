"""Tokenizers: raw bytes, byte-level BPE trained on a corpus, or a pretrained Hugging Face tokenizer."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers as hf
from tqdm import tqdm

from cem.data.chunking import pieces
from cem.data.corpus import Corpus
from cem.data.fsutil import cache_root
from cem.io import atomic_write
from cem.records import HF_TOKENIZER_META, TOKENIZER_CONFIG, TOKENIZER_META, check, read_record

EOT_TOKEN = "<|endoftext|>"
META_FILE = "cem_tokenizer.json"
# End-of-text candidates for a tokenizer.json without a tokenizer_config.json naming its eos token.
_EOT_CANDIDATES = (EOT_TOKEN, "<|end_of_text|>", "</s>", "<eos>")


class Tokenizer(ABC):
    """Maps text to token ids and back; `eot_id` is appended after every document.

    `name` identifies the exact token mapping (it keys the token caches); text is always
    encoded literally, so "<|endoftext|>" written in a document never becomes `eot_id`.
    """

    name: str
    vocab_size: int
    eot_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no end-of-text appended)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; `eot_id` is rendered as "<|endoftext|>"."""

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the tokenizer into `directory` so that `load_tokenizer(directory)` restores it."""


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255 and "<|endoftext|>" as 256; vocab_size is 257 (not rounded up)."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text`."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes decoded as UTF-8 (invalid sequences become U+FFFD), end-of-text as "<|endoftext|>"."""
        out, run = [], bytearray()
        for i in ids:
            if i == self.eot_id:
                out += [run.decode("utf-8", errors="replace"), EOT_TOKEN]
                run = bytearray()
            else:
                run.append(i)
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def save(self, directory: str | Path) -> None:
        """Write the metadata file (the byte tokenizer has no other state)."""
        _write_meta(Path(directory), {"kind": "byte", "name": self.name})


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer` with a chosen end-of-text id."""

    def __init__(self, backend: hf.Tokenizer, eot_id: int, name: str) -> None:
        backend.encode_special_tokens = True  # special-token text in documents is encoded literally
        self.backend = backend
        self.eot_id = eot_id
        self.name = name
        self.vocab_size = max(backend.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without the tokenizer's own BOS/EOS additions."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel by the Rust backend."""
        return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, special tokens included."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json and the metadata file."""
        directory = Path(directory)
        with atomic_write(directory / "tokenizer.json") as f:
            f.write(self.backend.to_str().encode("utf-8"))
        _write_meta(directory, {"kind": "hf", "name": self.name, "eot_id": self.eot_id})


def _write_meta(directory: Path, meta: dict) -> None:
    """Atomically write the tokenizer metadata file that `load_tokenizer` reads."""
    with atomic_write(directory / META_FILE) as f:
        f.write(json.dumps(meta, indent=2).encode("utf-8"))


def _content_name(label: str, backend: hf.Tokenizer, eot_id: int) -> str:
    """`label` plus a hash of the tokenizer's JSON and end-of-text id."""
    digest = hashlib.sha256(f"{backend.to_str()}\neot={eot_id}".encode()).hexdigest()
    return f"{label}-{digest[:16]}"


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Reload a tokenizer written by `Tokenizer.save` (e.g. into a run directory)."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no saved tokenizer in {directory} (missing {META_FILE})")
    meta = read_record(meta_path, TOKENIZER_META)
    if meta["kind"] == "byte":
        return ByteTokenizer()
    check(HF_TOKENIZER_META, meta, meta_path)  # the other kind TOKENIZER_META allows: "hf"
    backend = _backend_from_file(directory / "tokenizer.json")
    if not 0 <= meta["eot_id"] < backend.get_vocab_size(with_added_tokens=True):
        raise ValueError(f"{meta_path}: eot_id {meta['eot_id']} is outside the tokenizer's vocabulary")
    return HFTokenizer(backend, meta["eot_id"], meta["name"])


def _backend_from_file(path: Path) -> hf.Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json; ValueError naming the file if it is missing or broken."""
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}")
    try:
        return hf.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust backend raises a bare Exception
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path} is not a valid tokenizer file: {first}") from None


def get_tokenizer(spec: str, corpus: Corpus | None = None, cache_dir: str | Path | None = None) -> Tokenizer:
    """Tokenizer for `spec`: "byte", "bpe:N" (trained on `corpus`, cached in `cache_dir`), or a pretrained one.

    A pretrained spec is a directory written by `Tokenizer.save`, a directory or file with a
    Hugging Face tokenizer.json, or a model name for `transformers.AutoTokenizer` (if installed).
    """
    if spec == "byte":
        return ByteTokenizer()
    match = re.fullmatch(r"bpe:(\d+)", spec)
    if match:
        return train_bpe(corpus, int(match.group(1)), cache_dir)
    return _load_pretrained(spec)


MAX_BPE_VOCAB = 1 << 20  # symbols of a trained BPE (the paper's Llama tokenizer has 32,000)


def check_spec(spec: str) -> None:
    """ValueError for a `bpe:N` tokenizer spec whose size `check_bpe_size` refuses: said before a corpus is read."""
    match = re.fullmatch(r"bpe:(\d+)", spec)
    if match:
        check_bpe_size(int(match.group(1)))


def check_bpe_size(vocab_size: int) -> None:
    """ValueError unless a BPE of `vocab_size` symbols can be trained: 257 (bytes + end-of-text) to MAX_BPE_VOCAB."""
    if vocab_size < 257:
        raise ValueError(f"tokenizer bpe:{vocab_size}: need at least 257 symbols (256 bytes + {EOT_TOKEN})")
    if vocab_size > MAX_BPE_VOCAB:  # the tokenizers library aborts the process (no exception) far above this
        raise ValueError(f"tokenizer bpe:{vocab_size}: at most {MAX_BPE_VOCAB:,} symbols")


def train_bpe(corpus: Corpus | None, vocab_size: int, cache_dir: str | Path | None = None) -> HFTokenizer:
    """Byte-level BPE of at most `vocab_size` symbols trained on the corpus's train split, cached by fingerprint.

    The cache is `<cache_dir or cache_root()/tokenizers>/bpe<N>-<corpus fingerprint>/`;
    a later call with the same corpus and size loads it instead of training.
    """
    if corpus is None:
        raise ValueError(f"bpe:{vocab_size} is trained on a corpus; pass corpus=")
    check_bpe_size(vocab_size)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tokenizers"
    directory = root / f"bpe{vocab_size}-{corpus.fingerprint()[:16]}"
    if (directory / META_FILE).is_file():
        return load_tokenizer(directory)
    docs = corpus.splits["train"]
    texts = [piece for doc in docs for piece in pieces(doc)]
    source = f"the training split of {corpus.name} ({len(docs):,} documents, {sum(map(len, docs)):,} characters); cached in {directory}"
    tokenizer = bpe_from_texts(texts, vocab_size, source)
    tokenizer.save(directory)
    return tokenizer


def bpe_from_texts(texts: Sequence[str], vocab_size: int, source: str) -> HFTokenizer:
    """Byte-level BPE of at most `vocab_size` symbols (end-of-text included) trained on `texts` (`source`
    says what they are, in the message announcing the training)."""
    check_bpe_size(vocab_size)
    print(f"training a {vocab_size}-symbol BPE tokenizer on {source}", file=sys.stderr)
    backend = hf.Tokenizer(hf.models.BPE())
    backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),  # the Rust trainer's own bar (a terminal only)
    )
    backend.train_from_iterator(tqdm(texts, desc="BPE: reading", unit="piece", file=sys.stderr, delay=2.0, leave=False), trainer, length=len(texts))
    eot_id = backend.token_to_id(EOT_TOKEN)
    return HFTokenizer(backend, eot_id, _content_name(f"bpe{vocab_size}", backend, eot_id))


def _load_pretrained(spec: str) -> Tokenizer:
    """A saved cem tokenizer, a tokenizer.json (file or its directory), or `AutoTokenizer.from_pretrained(spec)`."""
    path = Path(spec).expanduser()
    if (path / META_FILE).is_file():
        return load_tokenizer(path)
    json_path = path / "tokenizer.json" if path.is_dir() else path
    if json_path.is_file():
        backend = _backend_from_file(json_path)
        eot_id = _find_eot_id(backend, json_path.parent)
        return HFTokenizer(backend, eot_id, _content_name("hf", backend, eot_id))
    try:
        import transformers
    except ImportError:
        raise ValueError(
            f"unknown tokenizer {spec!r}: not 'byte' or 'bpe:N', no tokenizer.json at that path, "
            "and transformers is not installed to load it from the Hugging Face Hub "
            "(pip install transformers)"
        ) from None
    try:
        pretrained = transformers.AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokenizer {spec!r} could not be loaded with transformers: {e}") from e
    if not getattr(pretrained, "is_fast", False) or pretrained.eos_token_id is None:
        raise ValueError(f"tokenizer {spec!r}: need a fast tokenizer with an eos token")
    backend = pretrained.backend_tokenizer
    eot_id = pretrained.eos_token_id
    return HFTokenizer(backend, eot_id, _content_name("hf", backend, eot_id))


def _find_eot_id(backend: hf.Tokenizer, directory: Path) -> int:
    """End-of-text id: tokenizer_config.json's eos_token, else the first known end-of-text token present."""
    config_path = directory / "tokenizer_config.json"
    candidates = list(_EOT_CANDIDATES)
    if config_path.is_file():
        eos = read_record(config_path, TOKENIZER_CONFIG).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            candidates.insert(0, eos)
    for token in candidates:
        token_id = backend.token_to_id(token)
        if token_id is not None:
            return token_id
    raise ValueError(f"{directory}: cannot find an end-of-text token (tried {candidates})")
