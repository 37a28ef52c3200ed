"""The decoding cache: per attention application, the tensors of past tokens that later queries read.

Llama attention stores keys and values. CEM attention stores keys once (they are the values); with a
key-query diagonal it stores the normalised context ĥ instead (as many numbers), from which the keys and
the diagonal term are exact (`CEMAttention.context`, `CEMAttention.query_side`). Buffers are allocated
once for the whole generation (`max_len` positions) and filled in place; `state` holds per-slot values
that are not per token.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CacheSlot:
    """The cache of one attention application: named buffers (B, ..., max_len, width), seq on dim -2."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0
        self.buffers: dict[str, Tensor] = {}
        self.state: dict[str, object] = {}  # not per token: never counted in bytes_per_token
        self.children: dict[int, CacheSlot] = {}

    def child(self, index: int) -> "CacheSlot":
        """The slot of the index-th application of a reused layer (plain layer reuse)."""
        if index == 0:
            return self
        return self.children.setdefault(index, CacheSlot(self.max_len))

    def update(self, **new: Tensor) -> dict[str, Tensor]:
        """Append the new positions of each named tensor; return every tensor over all positions so far."""
        n = next(iter(new.values())).shape[-2]
        if self.length + n > self.max_len:
            raise ValueError(f"sequence too long for the cache: {self.length} cached + {n} new > {self.max_len} positions")
        out = {}
        for name, t in new.items():
            buf = self.buffers.get(name)
            if buf is None:
                shape = (*t.shape[:-2], self.max_len, t.shape[-1])
                buf = self.buffers[name] = torch.empty(shape, dtype=t.dtype, device=t.device)
            buf[..., self.length : self.length + n, :] = t
            out[name] = buf[..., : self.length + n, :]
        self.length += n
        return out

    def slots(self):
        yield self
        for c in self.children.values():
            yield from c.slots()

    def bytes_per_token(self) -> int:
        """Bytes one position of one sequence takes in this slot and its children."""
        total = 0
        for slot in self.slots():
            for buf in slot.buffers.values():
                total += buf[..., :1, :].numel() // buf.shape[0] * buf.element_size()
        return total


class Cache:
    """All slots of a model, one per attention sublayer, keyed by name; `length` tokens cached so far."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._slots: dict[str, CacheSlot] = {}

    def slot(self, name: str) -> CacheSlot:
        return self._slots.setdefault(name, CacheSlot(self.max_len))

    @property
    def length(self) -> int:
        return next(iter(self._slots.values())).length if self._slots else 0

    def bytes_per_token(self) -> int:
        """Cache bytes per token per sequence, over all layers."""
        return sum(s.bytes_per_token() for s in self._slots.values())
