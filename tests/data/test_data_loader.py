"""Tests for SequenceSampler (windows, determinism, resume, rank sharding) and iter_eval_batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cem.data import SequenceSampler, TokenSplit, iter_eval_batches

SEQ_LEN = 8


def _split(n_tokens: int = 8 * 25 + 3) -> TokenSplit:
    return TokenSplit("toy/train", np.arange(n_tokens, dtype=np.uint16), n_bytes=n_tokens)


def _window_index(x: torch.Tensor) -> list[int]:
    """Window index of each row (tokens are their own positions, so row start = w * SEQ_LEN)."""
    assert torch.all(x[:, 0] % SEQ_LEN == 0)
    return (x[:, 0] // SEQ_LEN).tolist()


def test_batches_are_shifted_windows():
    split = _split()
    x, y = SequenceSampler(split, SEQ_LEN).next_batch(4)
    assert x.shape == y.shape == (4, SEQ_LEN) and x.dtype == y.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:])
    for row_x, row_y, w in zip(x, y, _window_index(x)):
        window = torch.arange(w * SEQ_LEN, w * SEQ_LEN + SEQ_LEN + 1)
        assert torch.equal(row_x, window[:-1]) and torch.equal(row_y, window[1:])


def test_each_epoch_visits_every_window_once_in_a_seeded_order():
    sampler = SequenceSampler(_split(), SEQ_LEN, seed=3)
    n = sampler.n_windows
    assert n == 25
    epoch0 = _window_index(sampler.next_batch(n)[0])
    epoch1 = _window_index(sampler.next_batch(n)[0])
    assert sorted(epoch0) == sorted(epoch1) == list(range(n))
    assert epoch0 == np.random.default_rng(3).permutation(n).tolist()
    assert epoch1 == np.random.default_rng(4).permutation(n).tolist()


def test_same_seed_same_batches_other_seed_differs():
    a, b, c = (SequenceSampler(_split(), SEQ_LEN, seed=s) for s in (0, 0, 1))
    for _ in range(10):
        xa, xb, xc = a.next_batch(3)[0], b.next_batch(3)[0], c.next_batch(3)[0]
        assert torch.equal(xa, xb)
    assert not torch.equal(xa, xc)


def test_resume_from_state_dict_gives_identical_batches():
    reference = SequenceSampler(_split(), SEQ_LEN, seed=7)
    expected = [reference.next_batch(4)[0] for _ in range(15)]  # crosses two epoch boundaries
    for stop in (0, 5, 6, 13):
        sampler = SequenceSampler(_split(), SEQ_LEN, seed=7)
        for _ in range(stop):
            sampler.next_batch(4)
        resumed = SequenceSampler(_split(), SEQ_LEN, seed=0)
        resumed.load_state_dict(sampler.state_dict())
        for batch in expected[stop:]:
            assert torch.equal(resumed.next_batch(4)[0], batch)


def test_state_dict_for_other_data_is_rejected():
    state = SequenceSampler(_split(), SEQ_LEN).state_dict()
    with pytest.raises(ValueError, match="n_windows=25 but this sampler has 12"):
        SequenceSampler(_split(8 * 12 + 1), SEQ_LEN).load_state_dict(state)
    with pytest.raises(ValueError, match="seq_len=8 but this sampler has 4"):
        SequenceSampler(_split(), 4).load_state_dict(state)


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_batches_concatenate_to_the_single_process_batch(world_size):
    single = SequenceSampler(_split(), SEQ_LEN, seed=5)
    ranks = [SequenceSampler(_split(), SEQ_LEN, seed=5, rank=r, world_size=world_size)
             for r in range(world_size)]
    for step in range(12):  # 12 * 2 * world_size windows: several epochs of 25
        x, y = single.next_batch(2 * world_size)
        parts = [r.next_batch(2) for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
        if step == 0:
            windows = [w for p in parts for w in _window_index(p[0])]
            assert len(set(windows)) == len(windows) == 2 * world_size


def test_split_shorter_than_one_sequence():
    message = r"split 'toy/train' has 8 tokens, fewer than one sequence of seq_len \+ 1 = 9"
    with pytest.raises(ValueError, match=message):
        SequenceSampler(_split(8), SEQ_LEN)
    SequenceSampler(_split(9), SEQ_LEN)


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match="rank must be in"):
        SequenceSampler(_split(), SEQ_LEN, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        SequenceSampler(_split(), SEQ_LEN).next_batch(0)


@pytest.mark.parametrize("n_tokens", [8 * 10 + 1, 8 * 10 + 4, 5])
def test_eval_batches_cover_every_target_once(n_tokens):
    tokens = np.arange(n_tokens, dtype=np.uint32)
    batches = list(iter_eval_batches(tokens, SEQ_LEN, batch_size=3))
    xs = torch.cat([x.reshape(-1) for x, _ in batches])
    ys = torch.cat([y.reshape(-1) for _, y in batches])
    assert ys.tolist() == list(range(1, n_tokens))
    assert xs.tolist() == list(range(0, n_tokens - 1))
    assert all(x.shape == y.shape and x.shape[0] <= 3 for x, y in batches)
    assert all(x.shape[1] == SEQ_LEN for x, _ in batches[:-1])


def test_eval_batches_limit_and_errors():
    tokens = np.arange(8 * 10 + 4)
    assert len(list(iter_eval_batches(tokens, SEQ_LEN, batch_size=3))) == 5  # 4 full-window batches + tail
    limited = list(iter_eval_batches(tokens, SEQ_LEN, batch_size=3, max_batches=2))
    assert [x.shape for x, _ in limited] == [(3, SEQ_LEN), (3, SEQ_LEN)]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        iter_eval_batches(np.arange(1), SEQ_LEN, 3)


def _first_window(n_tokens: int, seq_len: int, stride: int) -> list[int]:
    """The start of the window that scores each target t = 1 .. n-1, found independently of the loader: windows
    start at 0, stride, 2 stride, ... and one more ends at the last token; the first of them holding t scores it."""
    last = n_tokens - 1 - seq_len
    starts = sorted({*range(0, last + 1, stride), last}) if last >= 0 else [0]
    return [min(s for s in starts if s + seq_len >= t) for t in range(1, n_tokens)]


@pytest.mark.parametrize("n_tokens,seq_len,stride", [(81, 8, 8), (81, 8, 4), (84, 8, 3), (9, 8, 1), (5, 8, 2), (100, 7, 5), (37, 6, 6), (10, 9, 4)])
def test_sliding_eval_batches_score_every_target_once_with_the_context_of_its_first_window(n_tokens, seq_len, stride):
    tokens = np.arange(n_tokens, dtype=np.uint32)
    batches = list(iter_eval_batches(tokens, seq_len, batch_size=3, stride=stride))
    scored = {}  # target -> the first token of its context
    for x, y in batches:
        assert x.shape == y.shape and x.shape[0] <= 3
        for xr, yr in zip(x.tolist(), y.tolist()):
            assert [v for v in yr if v != -100] == sorted(v for v in yr if v != -100)
            for v in yr:
                if v != -100:
                    assert v not in scored
                    scored[v] = xr[0]
    assert sorted(scored) == list(range(1, n_tokens))
    assert [scored[t] for t in range(1, n_tokens)] == _first_window(n_tokens, seq_len, stride)
    if n_tokens - 1 >= seq_len:  # past the first window, every target has at least seq_len - stride tokens before it
        assert all(t - scored[t] >= seq_len - stride + 1 for t in range(seq_len + 1, n_tokens))
        assert all(x.shape[1] == seq_len for x, _ in batches)


def test_a_stride_of_the_sequence_length_is_the_disjoint_windows():
    tokens = np.arange(8 * 10 + 4)
    plain = list(iter_eval_batches(tokens, SEQ_LEN, 3))
    same = list(iter_eval_batches(tokens, SEQ_LEN, 3, stride=SEQ_LEN))
    assert len(plain) == len(same) and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(plain, same))
    for stride in (0, SEQ_LEN + 1):
        with pytest.raises(ValueError, match="stride must be between 1 and the sequence length 8"):
            iter_eval_batches(tokens, SEQ_LEN, 3, stride=stride)


@pytest.mark.parametrize("n_tokens,stride", [(81, None), (84, None), (5, None), (84, 3), (9, 1), (5, 2), (81, 8)])
def test_eval_batch_count_is_the_batches_yielded(n_tokens, stride):
    from cem.data import eval_batch_count

    assert eval_batch_count(n_tokens, SEQ_LEN, 3, stride) == len(list(iter_eval_batches(np.arange(n_tokens), SEQ_LEN, 3, stride=stride)))
