"""The decoding cache: per attention application, the tensors of past tokens that later queries read.

Llama attention stores keys and values. CEM attention stores keys once (they are the values); with a
key-query diagonal it stores the normalised context ĥ instead (as many numbers), from which the keys and
the diagonal term are exact (`CEMAttention.context`, `attention_core.cem_query_side`). Buffers are allocated
once for the whole generation (`max_len` positions) and filled in place; `state` holds per-slot values
that are not per token.

`StaticCache` is the same cache with fixed shapes, for a compiled decoding step (CUDA graphs): its layers
read every buffer whole (`max_len` positions) with the keys past the position masked, and the position is
a tensor, so no step reads a host value that changes (`cem.model.generate.static_step`).
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

    @property
    def start(self) -> int | Tensor:
        """The absolute position of the next new token (an int here; a 0-d tensor in a `StaticSlot`)."""
        return self.length

    def child(self, index: int) -> "CacheSlot":
        """The slot of the index-th application of a reused layer (plain layer reuse)."""
        if index == 0:
            return self
        child = self.children.get(index)
        if child is None:  # built once: a compiled step only looks it up
            child = self.children[index] = self._new_child()
        return child

    def _new_child(self) -> "CacheSlot":
        return CacheSlot(self.max_len)

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


class StaticSlot(CacheSlot):
    """A slot of a `StaticCache`: buffers (B, ..., max_len, width), zero-filled (masked keys never meet a
    NaN), written in place at the cache's position tensor; `update` returns them whole."""

    def __init__(self, cache: "StaticCache") -> None:
        super().__init__(cache.max_len)
        self.cache = cache

    @property
    def start(self) -> Tensor:
        return self.cache.position

    @property
    def length(self) -> int:
        return self.cache.length

    @length.setter
    def length(self, value: int) -> None:  # the cache advances all its slots at once (`StaticCache.advance`)
        pass

    def _new_child(self) -> "StaticSlot":
        return StaticSlot(self.cache)

    def update(self, **new: Tensor) -> dict[str, Tensor]:
        """Write the new positions of each named tensor at the position (index_copy_); return the whole buffers."""
        n = next(iter(new.values())).shape[-2]
        index = self.cache.position + torch.arange(n, device=self.cache.position.device)
        out = {}
        for name, t in new.items():
            buf = self.buffers.get(name)
            if buf is None:
                buf = self.buffers[name] = torch.zeros((*t.shape[:-2], self.max_len, t.shape[-1]), dtype=t.dtype, device=t.device)
                torch._dynamo.mark_static_address(buf)  # CUDA graphs write it in place instead of copying it
            out[name] = buf.index_copy_(-2, index, t)
        return out


class StaticCache(Cache):
    """A `Cache` of fixed shapes: one position tensor shared by every slot, advanced after each forward by
    `advance` (outside any compiled graph); `length` is its host copy."""

    def __init__(self, max_len: int, device: torch.device | str = "cpu") -> None:
        super().__init__(max_len)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        torch._dynamo.mark_static_address(self.position)
        self._length = 0

    def slot(self, name: str) -> StaticSlot:
        found = self._slots.get(name)
        if found is None:  # built by the prefill: a compiled step only looks it up
            found = self._slots[name] = StaticSlot(self)
        return found

    @property
    def length(self) -> int:
        return self._length

    def advance(self, n: int) -> None:
        """Count `n` more cached positions (after a forward of `n` new tokens wrote them)."""
        if self._length + n > self.max_len:
            raise ValueError(f"sequence too long for the cache: {self._length} cached + {n} new > {self.max_len} positions")
        self.position.add_(n)
        self._length += n
