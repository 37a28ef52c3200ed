"""Data layer: corpora, tokenizers, cached token shards and batch samplers."""

from cem.data.corpora import KNOWN_CORPORA, SPLITS, Corpus, CorpusSpec, load_corpus, parse_corpus, prepared_data_dir, resolve_data_dir
from cem.data.loader import SequenceSampler, eval_batch_count, iter_eval_batches
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
    "CorpusSpec",
    "HFTokenizer",
    "SequenceSampler",
    "TokenSplit",
    "Tokenizer",
    "build_split",
    "get_tokenizer",
    "eval_batch_count",
    "iter_eval_batches",
    "load_corpus",
    "parse_corpus",
    "load_tokenizer",
    "prepared_data_dir",
    "resolve_data_dir",
    "token_cache_dir",
]
