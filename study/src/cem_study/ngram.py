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
A stream is scored unbroken (every position, its context reaching back across everything before it) or
as the transformer is scored (`scored_positions`): disjoint windows of the context length, the context
reset at each window's start.

Everything is vectorised with numpy, without a limit on the order: a k-gram's id is its rank among the
training's distinct k-grams and its key is (id of its first k - 1 tokens) V + its last token, an int64
below (training tokens) V that no other k-gram shares (a trie level as a sorted array; base-V keys of
whole 8-grams would overflow, 257^8 > 2^64); tables are sorted unique keys (np.unique), lookups
np.searchsorted, and the ids of every k-gram of a stream follow from those of its (k-1)-grams.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from cem.data import SPLITS, Corpus, Tokenizer, build_split, get_tokenizer, load_corpus

__all__ = ["KneserNey", "modified_kn_discounts", "ngram_baseline", "scored_positions"]

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
    """Tables of one order k: the sorted keys of every training k-gram (its id is its index in them), c_k by id,
    and by context id (the id of a (k-1)-gram) T_k(h) and gamma_k's numerator."""

    def __init__(self, grams: np.ndarray, counts: np.ndarray, n_contexts: int, vocab_size: int) -> None:
        self.grams, self.counts, self.vocab_size = grams, counts, vocab_size  # counts[id] = c_k, 0 for none
        seen = counts > 0
        keys, counts = grams[seen], counts[seen]
        self.discounts = np.array((0.0, *modified_kn_discounts(counts)))  # indexed by min(count, 3)
        discount = self.discounts[np.minimum(counts, 3)]
        # keys are sorted, so keys // V (the context's id) is sorted too and each context's k-grams are contiguous
        contexts, starts = np.unique(keys // vocab_size, return_index=True)
        self.ctx_total, self.ctx_discount = np.zeros(n_contexts), np.zeros(n_contexts)
        self.ctx_total[contexts] = np.add.reduceat(counts, starts).astype(np.float64)  # T_k(h) = sum_w c_k(h w)
        self.ctx_discount[contexts] = np.add.reduceat(discount, starts)  # D1 N1(h.) + D2 N2(h.) + D3+ N3+(h.)

    def ids(self, context_ids: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Id of each k-gram given as (its context's id, its last token); -1 where it is no training k-gram."""
        key = context_ids * self.vocab_size + last  # negative (no match) where the context is unseen (id -1)
        idx = np.minimum(np.searchsorted(self.grams, key), self.grams.size - 1)
        return np.where((context_ids >= 0) & (self.grams[idx] == key), idx, -1)


def _as_ids(tokens, vocab_size: int) -> np.ndarray:
    """A 1-D int64 numpy array of token ids (from numpy, torch or a sequence), checked to lie in [0, vocab_size)."""
    if hasattr(tokens, "detach"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    ids = np.asarray(tokens).astype(np.int64, copy=False).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got [{ids.min()}, {ids.max()}]")
    return ids


def scored_positions(n_tokens: int, order: int, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions i scored, tokens of the n-gram ending at each: its context plus x_i), for a stream of n_tokens.

    window None: the unbroken stream, every position, x_i after min(i, n - 1) tokens. window L: as the transformer
    is scored (`cem.data.iter_eval_batches`): windows x_s .. x_{s+L} at s = 0, L, 2L, ... (the last one shorter),
    every token but x_0 a target once, x_i after the min(i - s, n - 1) tokens of its window before it.
    """
    if window is None:
        positions = np.arange(n_tokens)
        return positions, np.minimum(positions + 1, order)
    if window < 1:
        raise ValueError(f"window must be a positive number of tokens (or None for the unbroken stream), got {window}")
    positions = np.arange(1, n_tokens)
    starts = (positions - 1) // window * window  # the window of target x_i holds x_s .. x_{s+L}
    return positions, np.minimum(positions - starts + 1, order)


class KneserNey:
    """Interpolated modified Kneser-Ney n-gram model of `order` over ids in [0, vocab_size).

    `KneserNey(5, 257).fit(train_ids).nll(eval_ids)` is the mean negative log-likelihood (nats per token)
    of every position of the evaluation stream (`window=L`: scored as the transformer is, `scored_positions`);
    `distribution(context)` is p(. | context) over the vocabulary.
    """

    def __init__(self, order: int = 5, vocab_size: int = 257) -> None:
        if order < 1 or vocab_size < 1:
            raise ValueError(f"need order >= 1 and vocab_size >= 1, got order={order}, vocab_size={vocab_size}")
        self.order, self.vocab_size = order, vocab_size
        self.orders: list[_Order] = []  # self.orders[k - 1] holds order k

    def fit(self, train_ids) -> KneserNey:
        """Count the training stream: raw counts at the top order, continuation counts N1+(. w_1..w_k) below it
        (keys and ids as in the module docstring)."""
        ids, v, n = _as_ids(train_ids, self.vocab_size), self.vocab_size, self.order
        if ids.size < n:
            raise ValueError(f"need at least {n} training tokens, got {ids.size}")
        if ids.size * v >= 2**63:
            raise ValueError(f"{ids.size} training tokens over {v} ids do not fit an int64 key")
        self.orders = []
        prefix = np.zeros(ids.size + 1, dtype=np.int64)  # id of the (k-1)-gram starting at each position (k = 1: empty)
        n_prefixes = 1
        for k in range(1, n + 1):
            m = ids.size - k + 1
            grams, first, gram_ids = np.unique(prefix[:m] * v + ids[k - 1 :], return_index=True, return_inverse=True)
            if k > 1:  # N1+(. w_1..w_{k-1}): distinct k-grams whose last k-1 tokens (from first + 1) are w_1..w_{k-1}
                self.orders.append(_Order(lower, np.bincount(prefix[first + 1], minlength=lower.size), lower_contexts, v))
            lower, lower_contexts = grams, n_prefixes
            prefix, n_prefixes = gram_ids, grams.size
        self.orders.append(_Order(lower, np.bincount(prefix, minlength=lower.size), lower_contexts, v))  # c_n: occurrences
        return self

    @property
    def discounts(self) -> list[tuple[float, float, float]]:
        """(D1, D2, D3+) of each order 1..n."""
        return [tuple(float(d) for d in o.discounts[1:]) for o in self.orders]

    def _gram_ids(self, ids: np.ndarray) -> list[np.ndarray]:
        """[g_0, .., g_n]: g_k[..., s] is the id of the k-gram starting at position s of the last axis (-1 where
        it is no training k-gram or runs past the end; g_0 = 0, the empty gram)."""
        if not self.orders:
            raise RuntimeError("fit the model before evaluating it")
        length = ids.shape[-1]
        out = [np.zeros(ids.shape[:-1] + (length + 1,), dtype=np.int64)]
        for k, table in enumerate(self.orders, start=1):
            g = np.full_like(out[0], -1)
            m = max(length - k + 1, 0)
            g[..., :m] = table.ids(out[-1][..., :m], ids[..., k - 1 : k - 1 + m])
            out.append(g)
        return out

    def _probs(self, gram_ids: list[np.ndarray], positions: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """p(x_i | h) at `positions` i, h the `lengths - 1` tokens before x_i (`_gram_ids` of the stream).

        Builds p_k from p_{k-1} for k = 1..n (module docstring); a position with fewer than k tokens keeps p_{k-1}.
        """
        p = np.full(gram_ids[0][..., positions].shape, 1.0 / self.vocab_size)  # p_0(w) = 1/V
        for k, table in enumerate(self.orders, start=1):
            use = lengths >= k
            start = np.where(use, positions - k + 1, 0)  # of the k-gram h w ending at x_i
            gram, context = np.where(use, gram_ids[k][..., start], -1), np.where(use, gram_ids[k - 1][..., start], -1)
            total = np.where(context >= 0, table.ctx_total[context], 0.0)
            discount = np.where(context >= 0, table.ctx_discount[context], 0.0)
            count = np.where(gram >= 0, table.counts[gram], 0)
            seen = use & (total > 0)
            safe_total = np.where(seen, total, 1.0)
            p_k = (count - table.discounts[np.minimum(count, 3)]) / safe_total + discount / safe_total * p
            p = np.where(seen, p_k, p)
        return p

    def distribution(self, context) -> np.ndarray:
        """p(w | context) for every w in the vocabulary (uses the last n - 1 tokens of `context`)."""
        ctx = _as_ids(context, self.vocab_size)[-(self.order - 1) :] if self.order > 1 else np.zeros(0, np.int64)
        streams = np.concatenate([np.broadcast_to(ctx, (self.vocab_size, ctx.size)), np.arange(self.vocab_size)[:, None]], axis=1)
        return self._probs(self._gram_ids(streams), np.array([ctx.size]), np.array([ctx.size + 1]))[:, 0]

    def log_probs(self, eval_ids, window: int | None = None) -> np.ndarray:
        """ln p(x_i | its context) at every position scored (`scored_positions`): on the unbroken stream, position i
        after x_{i-n+1} .. x_{i-1} (shorter contexts at its start); with `window`, the transformer's windows."""
        ids = _as_ids(eval_ids, self.vocab_size)
        gram_ids = self._gram_ids(ids)
        positions, lengths = scored_positions(ids.size, self.order, window)
        chunk = 1 << 20  # chunks bound the temporaries' memory
        return np.concatenate([np.log(self._probs(gram_ids, positions[a : a + chunk], lengths[a : a + chunk]))
                               for a in range(0, positions.size, chunk)] or [np.zeros(0)])

    def nll(self, eval_ids, window: int | None = None) -> float:
        """Mean negative log-likelihood in nats per token over the positions scored (perplexity = exp of it)."""
        return float(-self.log_probs(eval_ids, window).mean())


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
    window: int | None = None,
) -> dict:
    """Fit a KneserNey of `order` on the train split and score valid and test: losses in nats per token.

    `corpus` is a corpus spec for `load_corpus` (with `data_dir`), a Corpus, or {"train", "valid", "test"} -> ids;
    `tokenizer` a spec for `get_tokenizer` ("byte", "bpe:N", a saved tokenizer directory) or a Tokenizer,
    so the splits are exactly the token shards the transformer runs train and evaluate on. With `window` (the
    transformer's context length) each split is also scored in its windows (`scored_positions`): *_loss_windowed.
    """
    splits, vocab = _splits(corpus, tokenizer, data_dir)
    start = time.perf_counter()
    model = KneserNey(order, vocab).fit(splits["train"])
    out = {"order": order, "train_tokens": int(len(splits["train"]))}
    for split in ("valid", "test"):
        loss = model.nll(splits[split])
        out |= {f"{split}_loss": loss, f"{split}_perplexity": math.exp(loss)}
        if window is not None:
            out |= {f"{split}_loss_windowed": model.nll(splits[split], window), "window": window}
    return out | {"seconds": time.perf_counter() - start}
