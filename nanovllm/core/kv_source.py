"""NullConnector: the scheduler's KV source without a KV connector. It supplies nothing.

The scheduler asks its KV source at admission how many tokens past the prefix-cache hit it can
supply, tells it where they go, asks it for the step's transfers and tells it when a request
ends (`kv_transfer/base.py`). Without a connector the answers are: none, nothing to plan, no
transfers, nothing to keep. So the scheduler and the engine call one object always, and have no
"is there a connector?" branches.
"""

from __future__ import annotations

from typing import Any

from nanovllm.request import Request


class NullConnector:
    """The scheduler side of "no KV connector" (see the module docstring)."""

    config = None  # (no `KVTransferConfig`: nothing listens, nothing is named)

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

    def load_failed(self, step: int, errors: dict[str, str]) -> None:
        raise AssertionError("nothing is loaded without a KV connector")

    def check_kv_transfer_params(self, params: dict[str, Any]) -> str | None:
        return None

    async def await_remote_kv(self, params: dict[str, Any]) -> str | None:
        return None

    def reset_cache(self) -> None:
        pass

    def close(self) -> None:
        pass
