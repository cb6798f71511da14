"""KV-cache memory arithmetic: paged blocks against reserving `max_model_len` per request.

A request whose sequence holds `t` tokens of KV occupies, in nanovllm's paged cache,
`ceil(t / block_size)` blocks, i.e. `ceil(t / B) * B` slots: at most `B - 1` slots are wasted,
only in its last block (internal fragmentation). A contiguous cache must reserve, up front, room
for the longest sequence the request could reach, `max_model_len` slots, because it cannot grow
a request's region later without moving it.

The same KV memory (`capacity` slots) therefore holds `capacity // max_model_len` requests
contiguously, and about `capacity / mean(ceil(t_i / B) * B)` requests paged, where `t_i` is the
slots request i needs at its longest. A request with `p` prompt and `o` output tokens needs
`p + o - 1` slots: the last token is sampled and returned, never fed back, so its KV is never
written.

The functions are pure so that the test can check them against a hand-computed example; the
suite feeds them nanovllm's measured per-step figures and the workload's lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def kv_slots_needed(prompt_len: int, output_len: int) -> int:
    """KV slots a request needs at its longest (its last sampled token has no KV)."""
    return prompt_len + output_len - 1


def paged_slots(num_tokens: int, block_size: int) -> int:
    """Slots allocated to hold `num_tokens` tokens' KV in blocks of `block_size`."""
    return -(-num_tokens // block_size) * block_size


@dataclass(frozen=True)
class MemorySnapshot:
    """The KV memory of a set of live requests, paged and contiguous."""

    num_requests: int
    filled_slots: int  # slots that hold a token's KV
    paged_slots: int  # slots in the blocks allocated to them
    contiguous_slots: int  # max_model_len reserved per request

    @property
    def fragmentation(self) -> float:
        """Share of allocated paged slots that hold nothing (internal fragmentation)."""
        return 1.0 - self.filled_slots / self.paged_slots if self.paged_slots else 0.0

    @property
    def contiguous_waste(self) -> float:
        """Share of contiguously reserved slots that hold nothing."""
        return 1.0 - self.filled_slots / self.contiguous_slots if self.contiguous_slots else 0.0


def snapshot(token_counts: Sequence[int], block_size: int, max_model_len: int) -> MemorySnapshot:
    """Memory of requests holding `token_counts` tokens of KV each, both ways."""
    return MemorySnapshot(
        num_requests=len(token_counts),
        filled_slots=sum(token_counts),
        paged_slots=sum(paged_slots(t, block_size) for t in token_counts),
        contiguous_slots=len(token_counts) * max_model_len,
    )


@dataclass(frozen=True)
class Fit:
    """How many of a workload's requests fit at once in `capacity_slots`, each way."""

    capacity_slots: int
    contiguous: int  # capacity // max_model_len
    paged: int  # capacity / mean paged slots per request at full length
    paged_mean_slots: float

    @property
    def ratio(self) -> float:
        return self.paged / self.contiguous if self.contiguous else float("inf")


def requests_that_fit(
    lengths: Sequence[tuple[int, int]], capacity_slots: int, block_size: int, max_model_len: int
) -> Fit:
    """`lengths` are the workload's (prompt, output) pairs; each is counted at its longest."""
    needs = [paged_slots(kv_slots_needed(p, o), block_size) for p, o in lengths]
    mean = sum(needs) / len(needs)
    return Fit(
        capacity_slots=capacity_slots,
        contiguous=capacity_slots // max_model_len,
        paged=int(capacity_slots // mean),
        paged_mean_slots=mean,
    )


def time_weighted_fragmentation(allocated: Sequence[int], filled: Sequence[int]) -> float:
    """Internal fragmentation over a run: wasted slot-steps over allocated slot-steps."""
    total = sum(allocated)
    return 1.0 - sum(filled) / total if total else 0.0
