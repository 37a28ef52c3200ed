"""Token-window batches: a seeded, resumable, rank-sharded training sampler and in-order eval batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from typing import TYPE_CHECKING

import numpy as np

from cem.data.shards import TokenSplit

if TYPE_CHECKING:  # torch is imported where batches are made, so that the data layer's tokenising
    import torch  # worker processes (`cem data prepare`) do not load it


def _windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
    """Rows tokens[s : s + length] for each start s, as a (len(starts), length) int64 tensor."""
    import torch

    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts]))


class SequenceSampler:
    """Training batches of non-overlapping windows of `seq_len + 1` tokens, shuffled per epoch.

    Window w covers tokens [w * seq_len, w * seq_len + seq_len + 1), so consecutive windows share
    one boundary token and x/y are the window without its last/first token. Epoch e visits all
    windows in the order `np.random.default_rng(seed + e).permutation(n_windows)`; one call of
    `next_batch(B)` consumes the next `B * world_size` windows of that global order (continuing
    into the next epoch when one ends) and rank r gets the contiguous block [r * B, (r + 1) * B),
    so concatenating the ranks' batches in rank order gives the one-process batch of B * world_size.
    """

    def __init__(
        self, split: TokenSplit, seq_len: int, *, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.n_windows = (split.n_tokens - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(
                f"split {split.name!r} has {split.n_tokens} tokens, fewer than one sequence of "
                f"seq_len + 1 = {seq_len + 1} tokens"
            )
        self.tokens = split.tokens
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.index = 0  # position in the current epoch's global window order
        self._order: np.ndarray | None = None

    def _epoch_order(self) -> np.ndarray:
        """The current epoch's permutation of window indices."""
        if self._order is None:
            self._order = np.random.default_rng(self.seed + self.epoch).permutation(self.n_windows)
        return self._order

    def _take(self, count: int) -> np.ndarray:
        """The next `count` window indices of the global order, advancing the position."""
        taken = []
        while count > 0:
            chunk = self._epoch_order()[self.index : self.index + count]
            taken.append(chunk)
            count -= len(chunk)
            self.index += len(chunk)
            if self.index == self.n_windows:
                self.epoch, self.index, self._order = self.epoch + 1, 0, None
        return np.concatenate(taken)

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next (x, y), each (batch_size, seq_len) int64; y is x shifted left by one token."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        global_windows = self._take(batch_size * self.world_size)
        windows = global_windows[self.rank * batch_size : (self.rank + 1) * batch_size]
        rows = _windows(self.tokens, windows * self.seq_len, self.seq_len + 1)
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self) -> dict[str, int]:
        """Position (epoch, index in the global order) plus the settings it is only valid for."""
        return {
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "n_windows": self.n_windows,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a saved position; the next batch is the one that would have followed it."""
        for key in ("seq_len", "n_windows"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]} but this sampler has {getattr(self, key)}; "
                    "resume with the same data, tokenizer and seq_len"
                )
        self.seed, self.epoch, self.index, self._order = state["seed"], state["epoch"], state["index"], None


IGNORE = -100  # a target that is not scored (the default ignore_index of `cem.model.loss.next_token_loss`)


def iter_eval_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None = None, stride: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """All windows of `tokens` in order as (x, y) int64 batches: every token but the first is a target once.

    Without `stride` (or with `stride == seq_len`) the windows are disjoint, laid out as in SequenceSampler: full
    windows come in batches of `batch_size` rows, the last possibly smaller; a final partial window, if any, comes
    last as a (1, r) batch with r < seq_len. The context is reset at each window's start.

    With `stride < seq_len` the windows slide: they start every `stride` tokens, and each scores only the targets
    the windows before it did not (the others are `IGNORE`), so every target after the first window's has at least
    `seq_len - stride` tokens of context; a last full window ends at the split's end. `max_batches` stops early
    (coverage is then partial).
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}")
    if stride is not None and not 1 <= stride <= seq_len:
        raise ValueError(f"stride must be between 1 and the sequence length {seq_len}, got {stride}")
    if len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    batches = _eval_batches(tokens, seq_len, batch_size) if stride in (None, seq_len) else _sliding_batches(tokens, seq_len, batch_size, stride)
    return itertools.islice(batches, max_batches)


def eval_batch_count(n_tokens: int, seq_len: int, batch_size: int, stride: int | None = None) -> int:
    """How many batches `iter_eval_batches` yields for a split of `n_tokens` tokens."""
    if stride in (None, seq_len):
        n_full = (n_tokens - 1) // seq_len
        return -(-n_full // batch_size) + (n_full * seq_len < n_tokens - 1)
    starts = _sliding_starts(n_tokens, seq_len, stride)
    return -(-len(starts) // batch_size) if len(starts) else 1


def _eval_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of `iter_eval_batches`, without a limit."""
    n_full = (len(tokens) - 1) // seq_len
    starts = np.arange(n_full) * seq_len
    for i in range(0, n_full, batch_size):
        rows = _windows(tokens, starts[i : i + batch_size], seq_len + 1)
        yield rows[:, :-1], rows[:, 1:]
    tail_start = n_full * seq_len
    if tail_start < len(tokens) - 1:
        import torch

        tail = torch.from_numpy(np.array(tokens[tail_start:], dtype=np.int64))[None]
        yield tail[:, :-1], tail[:, 1:]


def _sliding_starts(n_tokens: int, seq_len: int, stride: int) -> np.ndarray:
    """Starts of the full sliding windows: every `stride` tokens, and one more ending at the last token."""
    if n_tokens - 1 < seq_len:
        return np.zeros(0, dtype=np.int64)
    starts = np.arange(0, n_tokens - 1 - seq_len + 1, stride)
    return starts if starts[-1] == n_tokens - 1 - seq_len else np.append(starts, n_tokens - 1 - seq_len)


def _sliding_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, stride: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of `iter_eval_batches` with `stride < seq_len`, without a limit."""
    import torch

    starts = _sliding_starts(len(tokens), seq_len, stride)
    if not len(starts):  # the split is shorter than one window: it is scored whole, as without a stride
        yield from _eval_batches(tokens, seq_len, batch_size)
        return
    # window k's targets are tokens[s_k + 1 .. s_k + seq_len]; those up to the previous window's last are scored
    first = np.concatenate([[0], starts[:-1] + seq_len - starts[1:]])  # position of each window's first new target
    for i in range(0, len(starts), batch_size):
        rows = _windows(tokens, starts[i : i + batch_size], seq_len + 1)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        y[torch.from_numpy(np.arange(seq_len)[None, :] < first[i : i + batch_size, None])] = IGNORE
        yield x, y
