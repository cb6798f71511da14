"""KV cache specs and groups: what each layer keeps, and which layers share a block table.

A layer's `KVCacheSpec` says what KV it must keep for a request (vLLM v1's names):

- `FullAttentionSpec`: a query sees every earlier token, so every token's K/V is kept;
- `SlidingWindowSpec`: a query at position p sees only p - sliding_window + 1 .. p, so a block
  wholly before the window of every query still to come is never read again.

Layers of one spec are put into *KV cache groups*; each group has its own block table per
request, kept by its own manager (`single_type_kv_cache_manager.py`), and every group takes its
blocks from one shared pool. For that, a block must cost the same memory whichever group takes
it: as in vLLM, every group has the same number of layers (`group_size`), and the cache holds
`group_size` K/V tensor pairs, tensor pair j shared by the j-th layer of every group. Block b of
tensor pair j belongs to whichever group holds block id b. (A type with fewer layers than its
groups' share leaves the rest of its last group's tensors unused: padding.)

A model with one attention type has one group of all its layers: one tensor pair per layer and
one block table per request, as a cache with no groups has.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL_ATTENTION = "full_attention"  # Hugging Face's `layer_types` names
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class KVCacheSpec:
    """What one layer keeps in a block of `block_size` tokens."""

    block_size: int


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """Every token's K/V, for as long as the request lives."""


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec):
    """Only the K/V a query can still see: the last `sliding_window` tokens."""

    sliding_window: int


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table per request, and their spec."""

    layer_indices: tuple[int, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheConfig:
    """The groups, and how many K/V tensor pairs the cache holds (each `num_blocks` blocks)."""

    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    num_kv_tensors: int

    @property
    def num_groups(self) -> int:
        return len(self.kv_cache_groups)

    @property
    def has_sliding_window(self) -> bool:
        return any(isinstance(g.kv_cache_spec, SlidingWindowSpec) for g in self.kv_cache_groups)

    def max_blocks_needed(self, num_slots: int, block_size: int, max_step_slots: int) -> int:
        """The most blocks one request of `num_slots` KV slots holds at once, every group
        together: a full group, all of them; a sliding group, those its window and one step's
        new slots (at most `max_step_slots`) span, never more than all of them."""
        every = -(-num_slots // block_size)
        total = 0
        for group in self.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(spec, SlidingWindowSpec):
                span = spec.sliding_window - 1 + min(max_step_slots, num_slots)
                total += min(every, -(-span // block_size) + 1)
            else:
                total += every
        return total

    def layer_to_group(self, num_layers: int) -> tuple[int, ...]:
        """Each layer's group id."""
        groups = [0] * num_layers
        for group_id, group in enumerate(self.kv_cache_groups):
            for i in group.layer_indices:
                groups[i] = group_id
        return tuple(groups)

    def layer_to_kv_tensor(self, num_layers: int) -> tuple[int, ...]:
        """Each layer's K/V tensor pair: its place within its group."""
        tensors = [0] * num_layers
        for group in self.kv_cache_groups:
            for j, i in enumerate(group.layer_indices):
                tensors[i] = j
        return tuple(tensors)


def single_group_config(num_layers: int, block_size: int) -> KVCacheConfig:
    """Every layer full attention, in one group (a model with no windows)."""
    group = KVCacheGroupSpec(tuple(range(num_layers)), FullAttentionSpec(block_size))
    return KVCacheConfig((group,), num_layers)


def layer_specs(
    layer_types: tuple[str, ...],
    sliding_window: int | None,
    num_layers: int,
    block_size: int,
    disable_hybrid_kv_cache_manager: bool = False,
) -> list[KVCacheSpec]:
    """Each layer's spec, from the model's `layer_types` (empty: all full) and window.

    With `disable_hybrid_kv_cache_manager` (vLLM's option) every layer keeps every token, as
    full attention does; the layers still attend within their windows.
    """
    specs: list[KVCacheSpec] = []
    for i in range(num_layers):
        kind = layer_types[i] if layer_types else FULL_ATTENTION
        if kind not in (FULL_ATTENTION, SLIDING_ATTENTION):
            raise ValueError(f"layer {i} has layer type {kind!r}: not {FULL_ATTENTION!r} or "
                             f"{SLIDING_ATTENTION!r}")  # fmt: skip
        if kind == SLIDING_ATTENTION and not disable_hybrid_kv_cache_manager:
            if not sliding_window or sliding_window < 1:
                raise ValueError(f"layer {i} slides, but sliding_window={sliding_window!r}")
            specs.append(SlidingWindowSpec(block_size, sliding_window))
        else:
            specs.append(FullAttentionSpec(block_size))
    return specs


def get_kv_cache_config(specs: list[KVCacheSpec]) -> KVCacheConfig:
    """Group layers of one spec into groups of `group_size` layers (vLLM's rule).

    `group_size` is the layer count of the largest type when the types are close in size (no
    more than 25% padding), else of the smallest: e.g. 12 sliding and 4 full layers make groups
    of 4 (three sliding groups and a full one), 5 sliding and 4 full make groups of 5.
    """
    by_spec: dict[KVCacheSpec, list[int]] = {}
    for i, spec in enumerate(specs):
        by_spec.setdefault(spec, []).append(i)
    sizes = [len(layers) for layers in by_spec.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.25 else min(sizes)
    groups = tuple(
        KVCacheGroupSpec(tuple(layers[start : start + group_size]), spec)
        for spec, layers in by_spec.items()
        for start in range(0, len(layers), group_size)
    )
    return KVCacheConfig(groups, group_size)
