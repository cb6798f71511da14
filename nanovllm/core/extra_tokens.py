"""Extra tokens: what a part adds to each running request's step, past the request's own tokens.

The scheduler gives a running request its own tokens to compute. A part may ask for more, and
the scheduler asks it through this one object, built once by the composition root
(`engine/setup.py`):

- `tokens_after(request)`: tokens to compute after the request's own this step, as ordinary
  tokens (speculative decoding's proposals, `spec_decode/speculator.py`, which the sampler then
  verifies). The token budget may cut some; the step samples a row for each that it keeps.
- `num_slots_after`: KV slots every request holds past its step's tokens, never cached (where a
  draft model writes the KV of what it proposes next: vLLM's `num_lookahead_tokens`);
- `tokens_rejected(kv, request, num_computed)`: a sampled row took back the extra tokens after
  the first `num_computed` (the sampler rejected them): the blocks past those tokens and the
  slots held after them, which held only rejected KV, go back to the free queue
  (`free_slots_from`).

The plain engine's, `ExtraTokens()`, adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanovllm.request import Request

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheManager


def no_tokens(request: Request) -> list[int]:
    """No request has tokens past its own."""
    return []


@dataclass(frozen=True)
class ExtraTokens:
    tokens_after: Callable[[Request], list[int]] = no_tokens
    num_slots_after: int = 0

    def tokens_rejected(self, kv: KVCacheManager, request: Request, num_computed: int) -> None:
        """The request keeps only the slots of its first `num_computed` tokens and the
        `num_slots_after` slots after them; the blocks past those go back."""
        free_slots_from(kv, request, num_computed, self.num_slots_after)


def free_slots_from(
    kv: KVCacheManager, request: Request, num_tokens: int, num_lookahead_tokens: int = 0
) -> None:
    """Keep only the slots of the request's first `num_tokens` tokens (and the
    `num_lookahead_tokens` reserved after them, see `KVCacheManager.allocate_slots`): in every
    KV cache group the blocks past them (which held rejected proposals, never cached) go back
    to the free queue, tail first."""
    req_id = request.request_id
    keep = -(-(num_tokens + num_lookahead_tokens) // kv.block_size)  # blocks kept (ceil)
    for manager in kv.coordinator.single_type_managers:
        blocks = manager.req_to_blocks.get(req_id, [])
        if len(blocks) > keep:
            kv.req_to_block_ids.pop(req_id, None)  # the table shrinks
        while len(blocks) > keep:
            block = blocks.pop()
            assert block.ref_cnt == 1 and block.block_hash is None, "a block past them is private"
            manager.free_block(req_id, block)
    kv.req_num_filled_slots[req_id] = num_tokens
