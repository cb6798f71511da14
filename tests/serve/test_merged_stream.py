"""MergedStream (a batch of prompts' streams as one): an error one stream raised reaches the
reader, even when it was queued behind outputs that `drain_ready` took at once, and even when
its stream's end was queued after it (the server's shutdown cuts every stream that way)."""

from __future__ import annotations

import asyncio

import pytest

from nanovllm.serve.async_engine import ServerShutdownError
from nanovllm.serve.merged_stream import MergedStream


class FakeStream:
    def __init__(self, items: list) -> None:
        self.items = items

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for item in self.items:
            if isinstance(item, BaseException):
                raise item
            yield item

    def abort(self) -> None:
        pass


def test_an_error_after_drained_outputs_is_raised_not_lost() -> None:
    async def read() -> list:
        stream = MergedStream("r", [FakeStream(["a", "b", ServerShutdownError("cut")])])
        await asyncio.sleep(0)  # (the pump queues everything, its end last)
        await asyncio.sleep(0)
        seen = [await stream.__anext__()]
        seen += stream.drain_ready()
        async for item in stream:
            seen.append(item)
        return seen

    with pytest.raises(ServerShutdownError, match="cut"):
        asyncio.run(read())
