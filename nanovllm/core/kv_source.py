"""The scheduler's KV source: computed tokens from outside the device pool, asked at admission.

The prefix cache (`kv_cache_manager.py`) says which of a request's first tokens already have KV
in the device pool. A KV source may supply the tokens right after them: the scheduler asks it at
admission how many (`get_num_new_matched_tokens`), tells it which blocks they go to
(`update_state_after_alloc`), asks it for the step's transfers (`build_connector_meta`) and
tells it when a request ends (`request_finished`). vLLM's KV connectors (`kv_transfer/`) are
KV sources; `KVSource` is the part of their interface the scheduler calls.

At admission the scheduler asks for a request's `ComputedPrefix` (`find_computed_prefix`): the
prefix-cache hit, then the tokens the source supplies after it. Those tokens need new blocks
(their KV is copied in) but no compute; the prefix's arithmetic says how many of each, so the
scheduler reads the same with or without a source.

Without a connector the source is `NoKVSource` (the scheduler's default), or for an engine the
`NullConnector`, which adds the engine's side of "no connector": it supplies nothing, plans
nothing, moves nothing, keeps nothing. So the scheduler and the engine call one object always,
and have no "is there a connector?" branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nanovllm.request import Request

if TYPE_CHECKING:
    from nanovllm.core.kv_cache_manager import KVCacheBlocks, KVCacheManager


class KVSource(Protocol):
    """What the scheduler asks of its KV source (see the module docstring)."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]: ...

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[int, ...], num_external_tokens: int
    ) -> None: ...

    def build_connector_meta(self, scheduler_output: Any) -> Any: ...

    def request_finished(
        self, request: Request, block_ids: tuple[int, ...]
    ) -> tuple[bool, dict | None]: ...


@dataclass(slots=True)
class ComputedPrefix:
    """A waiting request's first tokens that need no compute, found at admission: its
    prefix-cache hit in the device pool (`blocks`, `num_cached` tokens; None: no lookup), then the tokens its KV
    source supplies right after them (`num_external`), whose KV is loaded into new blocks."""

    source: KVSource
    blocks: KVCacheBlocks | None = None
    num_cached: int = 0
    num_external: int = 0

    @property
    def num_computed(self) -> int:
        """Tokens the request starts with as computed."""
        return self.num_cached + self.num_external

    def num_slots(self, num_new_tokens: int) -> int:
        """Slots to allocate past `blocks`: the supplied tokens' and the new tokens'."""
        return self.num_external + num_new_tokens

    def allocated(self, request: Request, block_ids: tuple[int, ...]) -> None:
        """The request was admitted with these blocks: the source plans its loads into them."""
        self.source.update_state_after_alloc(request, block_ids, self.num_external)


def find_computed_prefix(
    kv_cache_manager: KVCacheManager, source: KVSource, request: Request
) -> ComputedPrefix:
    """The prefix cache first, then `source` for the tokens right after the hit; nothing for a
    request that has computed tokens already."""
    if request.num_computed_tokens:
        return ComputedPrefix(source)
    blocks, num_cached = kv_cache_manager.get_computed_blocks(request)
    num_external, _ = source.get_num_new_matched_tokens(request, num_cached)
    return ComputedPrefix(source, blocks, num_cached, num_external)


class NoKVSource:
    """A KV source that supplies nothing: a scheduler's default."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[int, ...], num_external_tokens: int
    ) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> None:
        return None

    def request_finished(
        self, request: Request, block_ids: tuple[int, ...]
    ) -> tuple[bool, dict | None]:
        return False, None


class NullConnector(NoKVSource):
    """An engine's KV connector when it has none: the scheduler side supplies nothing, and the
    engine's calls (a failed load, a reset, closing) have nothing to do."""

    config = None  # (no `KVTransferConfig`: nothing listens, nothing is named)

    def load_failed(self, step: int, errors: dict[str, str]) -> None:
        raise AssertionError("nothing is loaded without a KV connector")

    def check_kv_transfer_params(self, params: dict[str, Any]) -> str | None:
        return None

    async def await_remote_kv(self, params: dict[str, Any]) -> str | None:
        return None

    def reset_cache(self) -> None:
        pass

    def tier_entries(self) -> list[tuple[bytes, int]]:
        return []

    def close(self) -> None:
        pass
