"""The Kneser-Ney n-gram baseline: proper distributions, a hand-computed unigram loss, agreement with a
dictionary-based reference, higher orders helping on repetitive text, finite loss on unseen tokens."""

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cem.data import iter_eval_batches
from cem_study.ngram import FALLBACK_DISCOUNTS, KneserNey, _splits, modified_kn_discounts, ngram_baseline


@pytest.fixture(scope="module")
def small():
    """A random stream over ids 0..3 (id 4 of the vocabulary of 5 never occurs)."""
    return np.random.default_rng(0).integers(0, 4, size=400)


def test_every_conditional_distribution_sums_to_one(small):
    model = KneserNey(3, 5).fit(small)
    seen = [tuple(small[i : i + 2]) for i in range(5)]
    for context in [*seen, (4, 4), (0, 4), (4,), (2,), ()]:
        p = model.distribution(context)
        assert p.shape == (5,) and (p > 0).all()
        assert abs(p.sum() - 1.0) < 1e-9, context


def test_unigram_loss_is_the_hand_computed_smoothed_unigram():
    # counts: id0 1, id1 1, id2 2, id3 3, id4 4, id5 0 -> n1=2, n2=1, n3=1, n4=1, N=11
    train = [0, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    y = 2 / (2 + 2 * 1)  # n1 / (n1 + 2 n2)
    d1, d2, d3 = 1 - 2 * y * 1 / 2, 2 - 3 * y * 1 / 1, 3 - 4 * y * 1 / 1  # 0.5, 0.5, 1.0
    gamma = (d1 * 2 + d2 * 1 + d3 * 2) / 11
    p = {w: (c - {1: d1, 2: d2}.get(c, d3)) / 11 + gamma / 6 if c else gamma / 6 for w, c in zip(range(6), (1, 1, 2, 3, 4, 0))}
    model = KneserNey(1, 6).fit(np.array(train))
    assert model.discounts == [(0.5, 0.5, 1.0)]
    evaluation = [0, 2, 3, 4, 5, 5, 1]
    expected = -sum(math.log(p[w]) for w in evaluation) / len(evaluation)
    assert abs(model.nll(np.array(evaluation)) - expected) < 1e-9
    assert abs(sum(p.values()) - 1) < 1e-12


def reference_model(train, order, vocab):
    """p(w | h) of interpolated modified Kneser-Ney written with dictionaries of tuples, one query at a time."""
    counts = {order: Counter(tuple(train[i : i + order]) for i in range(len(train) - order + 1))}
    for k in range(1, order):  # continuation counts: distinct left neighbours of each k-gram
        longer = {tuple(train[i : i + k + 1]) for i in range(len(train) - k)}
        counts[k] = Counter(g[1:] for g in longer)
    discounts = {}
    for k, table in counts.items():
        n = Counter(table.values())
        if min(n[1], n[2], n[3], n[4]) == 0:
            discounts[k] = FALLBACK_DISCOUNTS
            continue
        y = n[1] / (n[1] + 2 * n[2])
        ds = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
        discounts[k] = ds if all(0 < d <= r for r, d in zip((1, 2, 3), ds)) else FALLBACK_DISCOUNTS

    def disc(k, c):
        return 0.0 if c == 0 else discounts[k][min(c, 3) - 1]

    def prob(w, h):
        h = tuple(h)[-(order - 1) :] if order > 1 else ()
        k = len(h) + 1
        lower = prob(w, h[1:]) if h else 1.0 / vocab
        items = [(g[-1], c) for g, c in counts[k].items() if g[:-1] == h]
        total = sum(c for _, c in items)
        if total == 0:
            return lower
        gamma = sum(disc(k, c) for _, c in items) / total
        c = counts[k].get(h + (w,), 0)
        return (c - disc(k, c)) / total + gamma * lower

    prob.discounts = discounts
    return prob


def reference_log_probs(train, evaluation, order, vocab):
    """ln p(x_i | x_{i-n+1} .. x_{i-1}) at every position of the unbroken stream, by `reference_model`."""
    prob = reference_model(train, order, vocab)
    return [math.log(prob(w, evaluation[max(0, i - order + 1) : i])) for i, w in enumerate(evaluation)]


def int64_key_log_probs(train, evaluation, order, vocab):
    """The implementation before order 8 (int64 keys in base V, up to order 6 at V = 257), kept as the reference of
    orders 1-6: the same arithmetic in the same order, so the same numbers to the bit."""
    def keys(ids, k):
        key = np.zeros(max(ids.size - k + 1, 0), dtype=np.int64)
        for j in range(k):
            key = key * vocab + ids[j : j + key.size]
        return key

    def lookup(table, values, query, missing):
        idx = np.minimum(np.searchsorted(table, query), table.size - 1)
        return np.where(table[idx] == query, values[idx], missing)

    tables = []
    for k in range(1, order + 1):
        if k == order:
            grams, counts = np.unique(keys(train, k), return_counts=True)
        else:
            grams, counts = np.unique(np.unique(keys(train, k + 1)) % vocab**k, return_counts=True)
        discounts = np.array((0.0, *modified_kn_discounts(counts)))
        contexts, starts = np.unique(grams // vocab, return_index=True)
        tables.append((grams, counts, discounts, contexts, np.add.reduceat(counts, starts).astype(np.float64),
                       np.add.reduceat(discounts[np.minimum(counts, 3)], starts)))
    grams = np.lib.stride_tricks.sliding_window_view(np.concatenate([np.zeros(order - 1, np.int64), evaluation]), order)
    lengths = np.minimum(np.arange(evaluation.size) + 1, order)
    p, key = np.full(len(grams), 1.0 / vocab), np.zeros(len(grams), dtype=np.int64)
    for k, (table, counts, discounts, contexts, ctx_total, ctx_discount) in enumerate(tables, start=1):
        key = key + grams[:, order - k] * vocab ** (k - 1)
        total, discount = lookup(contexts, ctx_total, key // vocab, 0.0), lookup(contexts, ctx_discount, key // vocab, 0.0)
        count = lookup(table, counts, key, 0)
        seen = (lengths >= k) & (total > 0)
        safe_total = np.where(seen, total, 1.0)
        p = np.where(seen, (count - discounts[np.minimum(count, 3)]) / safe_total + discount / safe_total * p, p)
    return np.log(p)


@pytest.mark.parametrize("order", [2, 3])
def test_log_probs_match_a_dictionary_reference(order):
    rng = np.random.default_rng(order)
    train = [int(x) for x in rng.choice(6, size=300, p=[0.35, 0.25, 0.15, 0.1, 0.1, 0.05])]
    evaluation = [int(x) for x in rng.integers(0, 7, size=60)]  # id 6 never occurs in training
    model = KneserNey(order, 7).fit(np.array(train))
    expected = reference_log_probs(train, evaluation, order, 7)
    assert np.allclose(model.log_probs(np.array(evaluation)), expected, rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def byte_text():
    """Bytes (vocabulary 257, so 257^8 > 2^64: no base-V key holds an 8-gram) of a repetitive text: 8-grams seen 1 to 4+
    times; evaluation text partly seen in training (long matches), partly new (back-off to short contexts)."""
    rng = np.random.default_rng(9)
    words = [b"the ", b"cat ", b"sat ", b"on ", b"a ", b"mat, ", b"dog ", b"ran. "]
    text = b"".join(words[i] for i in rng.choice(len(words), size=220, p=[0.3, 0.15, 0.15, 0.1, 0.1, 0.08, 0.07, 0.05]))
    train = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    evaluation = np.concatenate([train[100:160], np.frombuffer(b"the cow sat. \xff", dtype=np.uint8), train[500:540]])
    return [int(x) for x in train], [int(x) for x in evaluation]


def test_order_8_over_bytes_matches_a_brute_force_count(byte_text):
    train, evaluation = byte_text
    model = KneserNey(8, 257).fit(np.array(train))
    prob = reference_model(train, 8, 257)
    assert model.discounts == [tuple(prob.discounts[k]) for k in range(1, 9)]
    assert FALLBACK_DISCOUNTS not in model.discounts[4:]  # orders 5-8: discounts come from their count-of-counts
    expected = [math.log(prob(w, evaluation[max(0, i - 7) : i])) for i, w in enumerate(evaluation)]
    assert np.allclose(model.log_probs(np.array(evaluation)), expected, rtol=0, atol=1e-9)
    for context in (evaluation[:7], evaluation[60:67], [255] * 7, []):
        p = model.distribution(context)
        assert abs(p.sum() - 1.0) < 1e-9 and np.allclose(p[[evaluation[7], 0, 256]], [prob(w, context) for w in (evaluation[7], 0, 256)], rtol=0, atol=1e-12)


@pytest.mark.parametrize("order", [4, 8])
@pytest.mark.parametrize("window", [5, 7, 64])
def test_windowed_scoring_is_the_transformers_windows(byte_text, order, window):
    """Each target of cem's evaluation windows (`iter_eval_batches`, the last one partial) after the tokens of its
    window before it, and nothing before the window: the reference model at exactly those contexts."""
    train, evaluation = byte_text
    model = KneserNey(order, 257).fit(np.array(train))
    prob = reference_model(train, order, 257)
    expected = []
    for x, y in iter_eval_batches(np.array(evaluation), window, batch_size=3):
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            expected += [math.log(prob(w, row_x[: j + 1])) for j, w in enumerate(row_y)]
    got = model.log_probs(np.array(evaluation), window=window)
    assert len(got) == len(evaluation) - 1 and np.allclose(got, expected, rtol=0, atol=1e-9)
    assert model.nll(np.array(evaluation), window=window) == pytest.approx(-sum(expected) / len(expected), abs=1e-12)
    unbroken = model.log_probs(np.array(evaluation))
    assert (got != unbroken[1:]).any() if window < len(evaluation) - 1 else np.array_equal(got, unbroken[1:])


def test_a_window_must_be_positive(byte_text):
    with pytest.raises(ValueError, match="window must be a positive"):
        KneserNey(3, 257).fit(np.array(byte_text[0])).nll(np.array(byte_text[1]), window=0)


@pytest.fixture(scope="module")
def markov_bytes():
    """40,000 bytes of a sparse Markov chain (each byte followed by a few likely ones), and an evaluation stream of
    2,000 of them followed by 500 uniform bytes."""
    rng = np.random.default_rng(10)
    following = np.cumsum(rng.dirichlet(np.full(257, 0.05), size=257), axis=1)
    train, draws = np.zeros(40_000, dtype=np.int64), rng.random(40_000)
    for i in range(1, train.size):
        train[i] = min(np.searchsorted(following[train[i - 1]], draws[i]), 256)
    return train, np.concatenate([train[1000:3000], rng.integers(0, 257, size=500)])


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5, 6])
def test_orders_up_to_6_give_the_int64_key_implementations_numbers_to_the_bit(markov_bytes, order):
    train, evaluation = markov_bytes
    got = KneserNey(order, 257).fit(train).log_probs(evaluation)
    assert np.array_equal(got, int64_key_log_probs(train, evaluation, order, 257))


@pytest.mark.slow
def test_the_committed_6_gram_of_wikitext_2_bytes():
    """cpu128's regime check: the 6-gram fit on all 10,797,777 training bytes scores validation 1.1764437347119152."""
    data = Path(os.environ.get("CEM_DATA_DIR") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
    if not (data / "wikitext-2").is_dir():
        pytest.skip(f"no wikitext-2 under {data} (set $CEM_DATA_DIR)")
    fits = json.loads((Path(__file__).resolve().parents[2] / "study/results/cpu128/lr/ngram-cpu128.json").read_text())["fits"]
    committed = next(g for g in fits if g["order"] == 6)
    splits, vocab = _splits("wikitext-2", "byte", data)
    assert len(splits["train"]) == committed["train_tokens"] == 10_797_777
    assert KneserNey(6, vocab).fit(splits["train"]).nll(splits["valid"]) == committed["valid_loss"]


def test_a_higher_order_beats_unigrams_on_repetitive_text():
    text = np.frombuffer(b"the cat sat on the mat; the dog sat on the log. " * 40, dtype=np.uint8)
    train, valid = text[:1500], text[1500:]
    losses = {n: KneserNey(n, 257).fit(train).nll(valid) for n in (1, 3, 5)}
    assert losses[5] < losses[3] < losses[1] - 1.0


def test_the_loss_is_finite_on_a_token_never_seen_in_training(small):
    evaluation = np.concatenate([small[:50], [4, 4, 0, 4], small[50:60]])
    for order in (1, 3, 5):
        model = KneserNey(order, 5).fit(small)
        assert np.isfinite(model.nll(evaluation)) and model.distribution([4])[4] > 0


def test_discounts_fall_back_without_usable_count_of_counts():
    assert modified_kn_discounts(np.array([1, 1, 2])) == FALLBACK_DISCOUNTS


def test_the_baseline_on_given_splits(small):
    r = ngram_baseline({"train": small, "valid": small[:100], "test": small[100:200]}, tokenizer=5, order=3)
    assert r["order"] == 3 and r["train_tokens"] == 400
    assert r["valid_perplexity"] == pytest.approx(math.exp(r["valid_loss"])) and 1 < r["test_perplexity"] < 5
    assert "valid_loss_windowed" not in r
    w = ngram_baseline({"train": small, "valid": small[:100], "test": small[100:200]}, tokenizer=5, order=3, window=16)
    model = KneserNey(3, 5).fit(small)
    assert w["window"] == 16 and w["valid_loss"] == r["valid_loss"]
    assert w["valid_loss_windowed"] == model.nll(small[:100], 16) and w["test_loss_windowed"] == model.nll(small[100:200], 16)
