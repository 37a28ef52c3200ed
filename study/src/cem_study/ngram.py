"""A count-based n-gram baseline: interpolated modified Kneser-Ney over token ids.

What it is for: a transformer regime can speak to a claim about attention or depth only if it has
learnt more than local statistics, so its loss should be checked against an n-gram model trained on
the same train split and scored on the same valid/test streams (same tokenizer, same end-of-text
markers). A model that is not clearly below the n-gram loss has learnt little beyond n-gram counts.

The model is interpolated Kneser-Ney with modified discounting (three discounts D1, D2, D3+ per order
estimated from count-of-counts): S. F. Chen and J. Goodman, "An Empirical Study of Smoothing
Techniques for Language Modeling", Harvard TR-10-98 (1998), section "Modified Kneser-Ney smoothing"
(also Computer Speech & Language 13, 1999). Notation below: c_k(h w) is the count used at order k,
the raw count at the highest order n and the continuation count N1+(. h w) (number of distinct
tokens seen just before h w) below it; T_k(h) = sum_w c_k(h w); N_r(h .) the number of w with
c_k(h w) = r (r = 1, 2, 3+). Then, for a context h of k - 1 tokens and its suffix h' of k - 2 tokens,

    p_k(w | h) = (c_k(h w) - D_k(c_k(h w))) / T_k(h) + gamma_k(h) p_{k-1}(w | h'),
    gamma_k(h) = (D_k1 N_1(h .) + D_k2 N_2(h .) + D_k3+ N_3+(h .)) / T_k(h),

with p_k(w | h) = p_{k-1}(w | h') when h was never seen (T_k(h) = 0) and p_0(w) = 1 / V, so every
p_k(. | h) is a distribution over the whole vocabulary and every token has positive probability.
Positions near the start of a stream use the contexts they have (position i uses order min(i + 1, n)).

Everything is vectorised with numpy: a k-gram is an int64 key in base V (leftmost token most
significant), tables are sorted unique keys (np.unique) and lookups are np.searchsorted.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from cem.data import SPLITS, Corpus, Tokenizer, build_split, get_tokenizer, load_corpus

__all__ = ["KneserNey", "modified_kn_discounts", "ngram_baseline"]

# KenLM's --discount_fallback values, used for an order whose count-of-counts give no valid discounts.
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


def modified_kn_discounts(counts: np.ndarray) -> tuple[float, float, float]:
    """(D1, D2, D3+) from count-of-counts n_r: Y = n1/(n1+2n2), D_r = r - (r+1) Y n_{r+1}/n_r (Chen & Goodman 1998).

    Falls back to FALLBACK_DISCOUNTS when some n_r (r = 1..4) is zero or an estimate is outside (0, r].
    """
    n = [int(np.count_nonzero(counts == r)) for r in range(5)]  # n[r] = number of n-grams counted r times
    if min(n[1:5]) == 0:
        return FALLBACK_DISCOUNTS
    y = n[1] / (n[1] + 2 * n[2])
    d = tuple(r - (r + 1) * y * n[r + 1] / n[r] for r in (1, 2, 3))
    if not all(0.0 < d_r <= r for r, d_r in zip((1, 2, 3), d)):
        return FALLBACK_DISCOUNTS
    return d


class _Order:
    """Tables of one order k: sorted k-gram keys with their counts, and per context (k-1 tokens) T_k and gamma_k's numerator."""

    def __init__(self, keys: np.ndarray, counts: np.ndarray, vocab_size: int) -> None:
        self.keys, self.counts = keys, counts
        self.discounts = np.array((0.0, *modified_kn_discounts(counts)))  # indexed by min(count, 3)
        discount = self.discounts[np.minimum(counts, 3)]
        # keys are sorted, so keys // V (the context) is sorted too and each context's k-grams are contiguous
        self.ctx_keys, starts = np.unique(keys // vocab_size, return_index=True)
        self.ctx_total = np.add.reduceat(counts, starts).astype(np.float64)  # T_k(h) = sum_w c_k(h w)
        self.ctx_discount = np.add.reduceat(discount, starts)  # D1 N1(h.) + D2 N2(h.) + D3+ N3+(h.)

    def count(self, keys: np.ndarray) -> np.ndarray:
        """c_k of each k-gram key (0 when unseen)."""
        return _lookup(self.keys, self.counts, keys, 0)

    def context(self, ctx_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T_k(h), sum_w D_k(c_k(h w))) of each context key; (0, 0) when the context is unseen."""
        return _lookup(self.ctx_keys, self.ctx_total, ctx_keys, 0.0), _lookup(self.ctx_keys, self.ctx_discount, ctx_keys, 0.0)


def _lookup(table_keys: np.ndarray, table_values: np.ndarray, keys: np.ndarray, missing) -> np.ndarray:
    """table_values at the positions of `keys` in the sorted `table_keys`, `missing` where a key is absent."""
    if table_keys.size == 0:
        return np.full(keys.shape, missing, dtype=table_values.dtype)
    idx = np.minimum(np.searchsorted(table_keys, keys), table_keys.size - 1)
    return np.where(table_keys[idx] == keys, table_values[idx], missing)


def _as_ids(tokens, vocab_size: int) -> np.ndarray:
    """A 1-D int64 numpy array of token ids (from numpy, torch or a sequence), checked to lie in [0, vocab_size)."""
    if hasattr(tokens, "detach"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    ids = np.asarray(tokens).astype(np.int64, copy=False).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got [{ids.min()}, {ids.max()}]")
    return ids


def _keys(ids: np.ndarray, k: int, vocab_size: int) -> np.ndarray:
    """Key of every k-gram of the stream: sum_j ids[i+j] V^(k-1-j), for i = 0 .. len(ids) - k."""
    m = ids.size - k + 1
    key = np.zeros(max(m, 0), dtype=np.int64)
    for j in range(k):
        key = key * vocab_size + ids[j : j + m]
    return key


class KneserNey:
    """Interpolated modified Kneser-Ney n-gram model of `order` over ids in [0, vocab_size).

    `KneserNey(5, 257).fit(train_ids).nll(eval_ids)` is the mean negative log-likelihood (nats per token)
    of every position of the evaluation stream; `distribution(context)` is p(. | context) over the vocabulary.
    """

    def __init__(self, order: int = 5, vocab_size: int = 257) -> None:
        if order < 1 or vocab_size < 1:
            raise ValueError(f"need order >= 1 and vocab_size >= 1, got order={order}, vocab_size={vocab_size}")
        if order * math.log2(vocab_size) >= 63:
            raise ValueError(f"{order}-grams over {vocab_size} ids do not fit an int64 key")
        self.order, self.vocab_size = order, vocab_size
        self.orders: list[_Order] = []  # self.orders[k - 1] holds order k

    def fit(self, train_ids) -> KneserNey:
        """Count the training stream: raw counts at the top order, continuation counts N1+(. w_1..w_k) below it."""
        ids, v = _as_ids(train_ids, self.vocab_size), self.vocab_size
        if ids.size < self.order:
            raise ValueError(f"need at least {self.order} training tokens, got {ids.size}")
        self.orders = []
        for k in range(1, self.order + 1):
            if k == self.order:  # c_n(w_1..w_n): occurrences of the n-gram
                keys, counts = np.unique(_keys(ids, k, v), return_counts=True)
            else:  # N1+(. w_1..w_k): distinct (k+1)-grams whose last k tokens are w_1..w_k
                longer = np.unique(_keys(ids, k + 1, v))
                keys, counts = np.unique(longer % v**k, return_counts=True)
            self.orders.append(_Order(keys, counts.astype(np.int64), v))
        return self

    @property
    def discounts(self) -> list[tuple[float, float, float]]:
        """(D1, D2, D3+) of each order 1..n."""
        return [tuple(float(d) for d in o.discounts[1:]) for o in self.orders]

    def _probs(self, grams: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """p(w | h) for rows of `grams` (P, n): the last column is w, the `lengths - 1` columns before it are h.

        Builds p_k from p_{k-1} for k = 1..n (module docstring); a row with fewer than k tokens keeps p_{k-1}.
        """
        if not self.orders:
            raise RuntimeError("fit the model before evaluating it")
        v, n = self.vocab_size, self.order
        p = np.full(len(grams), 1.0 / v)  # p_0(w) = 1/V
        key = np.zeros(len(grams), dtype=np.int64)
        for k in range(1, n + 1):
            key = key + grams[:, n - k] * v ** (k - 1)  # k-gram ending at w (leftmost token most significant)
            table = self.orders[k - 1]
            total, discount = table.context(key // v)
            count = table.count(key)
            seen = (lengths >= k) & (total > 0)
            safe_total = np.where(seen, total, 1.0)
            p_k = (count - table.discounts[np.minimum(count, 3)]) / safe_total + discount / safe_total * p
            p = np.where(seen, p_k, p)
        return p

    def distribution(self, context) -> np.ndarray:
        """p(w | context) for every w in the vocabulary (uses the last n - 1 tokens of `context`)."""
        ctx = _as_ids(context, self.vocab_size)[-(self.order - 1) :] if self.order > 1 else np.zeros(0, np.int64)
        grams = np.zeros((self.vocab_size, self.order), dtype=np.int64)
        grams[:, self.order - 1 - ctx.size : self.order - 1] = ctx
        grams[:, -1] = np.arange(self.vocab_size)
        return self._probs(grams, np.full(self.vocab_size, ctx.size + 1))

    def log_probs(self, eval_ids) -> np.ndarray:
        """ln p(x_i | x_{i-n+1} .. x_{i-1}) at every position i of the stream (shorter contexts at its start)."""
        ids, n = _as_ids(eval_ids, self.vocab_size), self.order
        padded = np.concatenate([np.zeros(n - 1, dtype=np.int64), ids])
        grams = np.lib.stride_tricks.sliding_window_view(padded, n)  # row i: x_{i-n+1} .. x_i (zeros before the start)
        lengths = np.minimum(np.arange(ids.size) + 1, n)
        out = np.empty(ids.size)
        for a in range(0, ids.size, 1 << 20):  # chunks bound the temporaries' memory
            out[a : a + (1 << 20)] = np.log(self._probs(grams[a : a + (1 << 20)], lengths[a : a + (1 << 20)]))
        return out

    def nll(self, eval_ids) -> float:
        """Mean negative log-likelihood in nats per token over the stream (perplexity = exp of it)."""
        return float(-self.log_probs(eval_ids).mean())


def _splits(corpus, tokenizer, data_dir) -> tuple[dict[str, np.ndarray], int]:
    """Token ids of train/valid/test and the vocabulary size, from a corpus spec or Corpus (via cem's data API)
    or from a mapping of split name to ids (then `tokenizer` may be a Tokenizer or a vocabulary size)."""
    if isinstance(corpus, dict):
        vocab = tokenizer if isinstance(tokenizer, int) else tokenizer.vocab_size
        return {s: np.asarray(corpus[s]) for s in SPLITS}, vocab
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus, data_dir)
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = get_tokenizer(str(tokenizer), corpus)
    return {s: build_split(corpus, tokenizer, s).tokens for s in SPLITS}, tokenizer.vocab_size


def ngram_baseline(
    corpus: str | Path | Corpus | dict = "wikitext-2",
    tokenizer: str | Tokenizer | int = "byte",
    order: int = 5,
    data_dir: str | Path | None = None,
) -> dict:
    """Fit a KneserNey of `order` on the train split and score valid and test: losses in nats per token.

    `corpus` is a corpus spec for `load_corpus` (with `data_dir`), a Corpus, or {"train", "valid", "test"} -> ids;
    `tokenizer` a spec for `get_tokenizer` ("byte", "bpe:N", a saved tokenizer directory) or a Tokenizer,
    so the splits are exactly the token shards the transformer runs train and evaluate on.
    """
    splits, vocab = _splits(corpus, tokenizer, data_dir)
    start = time.perf_counter()
    model = KneserNey(order, vocab).fit(splits["train"])
    valid, test = model.nll(splits["valid"]), model.nll(splits["test"])
    return {
        "order": order,
        "valid_loss": valid,
        "valid_perplexity": math.exp(valid),
        "test_loss": test,
        "test_perplexity": math.exp(test),
        "train_tokens": int(len(splits["train"])),
        "seconds": time.perf_counter() - start,
    }
