"""cem's own decoding cache, carried through Hugging Face `generate()` as `past_key_values` (`cache` since transformers 5.24).

`HFCache` *is* a `cem.model.Cache` (a subclass): CEM attention stores keys only (with a key-query diagonal
the normalised context ĥ only, the same bytes), Llama attention keys and values, exactly as in `LanguageModel.generate`.
It adds the few things `transformers.generate` asks of a cache object:

* `get_seq_length()` — how many positions are cached (read by `generate` before the prefill);
* `is_compileable = False` / `is_croppable = False` — so `generate` never tries to compile around it or to
  roll it back; `is_linear = (False,)` (transformers >= 5.24): it caches positions, not a recurrent state;
* `reorder_cache(beam_idx)` — picks batch rows, for beam search;
* buffers that grow (doubling) instead of failing when `generate` runs past the first allocation, because
  `generate` does not tell a model's forward how many tokens it will produce. Growing is capped at the
  model's context, which `LanguageModel.forward` enforces anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.cache import Cache, CacheSlot


class _GrowingSlot(CacheSlot):
    """A `CacheSlot` whose buffers are reallocated (capacity doubled, at most `limit`) when full."""

    def __init__(self, max_len: int, limit: int) -> None:
        super().__init__(max_len)
        self.limit = max(limit, max_len)

    def child(self, index: int) -> CacheSlot:
        if index == 0:
            return self
        return self.children.setdefault(index, _GrowingSlot(self.max_len, self.limit))

    def update(self, **new: Tensor) -> dict[str, Tensor]:
        need = self.length + next(iter(new.values())).shape[-2]
        if need > self.max_len and need <= self.limit:
            self._grow(min(self.limit, max(need, 2 * self.max_len)))
        return super().update(**new)

    def _grow(self, capacity: int) -> None:
        for name, buf in self.buffers.items():
            bigger = torch.empty((*buf.shape[:-2], capacity, buf.shape[-1]), dtype=buf.dtype, device=buf.device)
            bigger[..., : self.length, :] = buf[..., : self.length, :]
            self.buffers[name] = bigger
        self.max_len = capacity

    def reorder(self, index: Tensor) -> None:
        for name, buf in self.buffers.items():
            self.buffers[name] = buf.index_select(0, index.to(buf.device))


class HFCache(Cache):
    """`cem.model.Cache` with the interface `transformers.generate` needs (see the module docstring).

    `max_len` is the first allocation (positions); buffers grow up to `limit` (the model's context).
    """

    is_compileable = False
    is_croppable = False
    is_linear = (False,)  # transformers >= 5.24: a cache of positions (not a recurrent state); inputs are sliced by get_seq_length

    def __init__(self, max_len: int, limit: int | None = None) -> None:
        super().__init__(max_len)
        self.limit = max(limit or max_len, max_len)

    def slot(self, name: str) -> CacheSlot:
        return self._slots.setdefault(name, _GrowingSlot(self.max_len, self.limit))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of cached positions (the same in every slot)."""
        return self.length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.limit

    def all_slots(self):
        for slot in self._slots.values():
            yield from slot.slots()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Keep, for each new batch row, the cache row `beam_idx[row]` (beam search)."""
        for slot in self.all_slots():
            slot.reorder(beam_idx)

    def __repr__(self) -> str:
        return (
            f"HFCache(slots={len(self._slots)}, length={self.length}, limit={self.limit}, "
            f"bytes_per_token={self.bytes_per_token()})"
        )


class RowCache(Cache):
    """One `HFCache` per batch row, for left-padded batches (rows whose real tokens start at different
    positions). cem attention takes no padding mask, so `CEMForCausalLM` runs such batches row by row, each
    row on its own cache holding only its real tokens. `length` counts padded positions, as `transformers`
    counts them; `rows[r].length` the real tokens of row r.
    """

    is_compileable = False
    is_croppable = False
    is_linear = (False,)  # transformers >= 5.24: a cache of positions (not a recurrent state); inputs are sliced by get_seq_length

    def __init__(self, n_rows: int, max_len: int, limit: int | None = None) -> None:
        super().__init__(max_len)
        self.limit = max(limit or max_len, max_len)
        self.rows = [HFCache(max_len, self.limit) for _ in range(n_rows)]
        self.padded_length = 0

    @property
    def length(self) -> int:
        return self.padded_length

    def slot(self, name: str) -> CacheSlot:
        raise TypeError("a RowCache is read row by row (RowCache.rows[r].slot(name))")

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.padded_length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.limit

    def bytes_per_token(self) -> int:
        """Cache bytes per (real) token per sequence, over all layers."""
        return max((row.bytes_per_token() for row in self.rows), default=0)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Row r becomes a copy of old row beam_idx[r] (beam search)."""
        old = self.rows
        self.rows = [_clone(old[int(i)]) for i in beam_idx.tolist()]

    def __repr__(self) -> str:
        return f"RowCache(rows={len(self.rows)}, length={self.padded_length}, bytes_per_token={self.bytes_per_token()})"


def _clone(cache: HFCache) -> HFCache:
    new = HFCache(cache.max_len, cache.limit)
    for name, slot in cache._slots.items():
        _copy_slot(slot, new.slot(name))
    return new


def _copy_slot(src: CacheSlot, dst: CacheSlot) -> None:
    dst.max_len, dst.length = src.max_len, src.length
    dst.buffers = {k: v.clone() for k, v in src.buffers.items()}
    dst.state = dict(src.state)
    for index, child in src.children.items():
        _copy_slot(child, dst.child(index))
