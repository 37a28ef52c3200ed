"""Data layer: corpora, tokenizers, cached token shards and batch samplers."""

from cem.data.corpora import KNOWN_CORPORA, SPLITS, Corpus, load_corpus, prepared_data_dir, resolve_data_dir
from cem.data.loader import SequenceSampler, iter_eval_batches
from cem.data.shards import TokenSplit, build_split, token_cache_dir
from cem.data.tokenizers import (
    EOT_TOKEN,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    get_tokenizer,
    load_tokenizer,
)

__all__ = [
    "EOT_TOKEN",
    "KNOWN_CORPORA",
    "SPLITS",
    "ByteTokenizer",
    "Corpus",
    "HFTokenizer",
    "SequenceSampler",
    "TokenSplit",
    "Tokenizer",
    "build_split",
    "get_tokenizer",
    "iter_eval_batches",
    "load_corpus",
    "load_tokenizer",
    "prepared_data_dir",
    "resolve_data_dir",
    "token_cache_dir",
]
