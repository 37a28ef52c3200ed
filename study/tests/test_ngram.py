"""The Kneser-Ney n-gram baseline: proper distributions, a hand-computed unigram loss, agreement with a
dictionary-based reference, higher orders helping on repetitive text, finite loss on unseen tokens."""

import math
from collections import Counter

import numpy as np
import pytest

from cem_study.ngram import FALLBACK_DISCOUNTS, KneserNey, modified_kn_discounts, ngram_baseline


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


def reference_log_probs(train, evaluation, order, vocab):
    """Interpolated modified Kneser-Ney written with dictionaries, one position at a time."""
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
        k = len(h) + 1
        if k == 0 or k > order:
            return 1.0 / vocab
        lower = prob(w, h[1:]) if h else 1.0 / vocab
        items = [(g[-1], c) for g, c in counts[k].items() if g[:-1] == h]
        total = sum(c for _, c in items)
        if total == 0:
            return lower
        gamma = sum(disc(k, c) for _, c in items) / total
        c = counts[k].get(h + (w,), 0)
        return (c - disc(k, c)) / total + gamma * lower

    out = []
    for i, w in enumerate(evaluation):
        h = tuple(evaluation[max(0, i - order + 1) : i])
        out.append(math.log(prob(w, h)))
    return out


@pytest.mark.parametrize("order", [2, 3])
def test_log_probs_match_a_dictionary_reference(order):
    rng = np.random.default_rng(order)
    train = [int(x) for x in rng.choice(6, size=300, p=[0.35, 0.25, 0.15, 0.1, 0.1, 0.05])]
    evaluation = [int(x) for x in rng.integers(0, 7, size=60)]  # id 6 never occurs in training
    model = KneserNey(order, 7).fit(np.array(train))
    expected = reference_log_probs(train, evaluation, order, 7)
    assert np.allclose(model.log_probs(np.array(evaluation)), expected, rtol=0, atol=1e-9)


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
