"""Several engine requests' outputs as one stream: a completion request with a batch of prompts.

OpenAI's `/v1/completions` takes a list of prompts; vLLM makes each prompt a request of its own
in the engine (`{request_id}-{i}`) and merges their outputs as they come
(`merge_async_iterators`): a client streaming a batch sees the prompts' tokens interleaved, each
chunk's choice `index` saying whose they are (prompt i's completion j is index i * n + j). A
request of one prompt is a batch of one.

    RequestStream 0 --pump--\\
    RequestStream 1 --pump---> one queue of (prompt index, RequestOutput) -> the handler
    RequestStream 2 --pump--/

Each stream's outputs are forwarded by a task of its own into one queue, in the order they
arrive, so the handler waits on one queue whatever the batch size. `abort()` aborts every
request still running (a client that leaves frees all of its prompts' KV blocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nanovllm.engine.outputs import RequestOutput
from nanovllm.serve.async_engine import RequestStream

_END = object()  # a pump's last item: its stream has ended


class MergedStream:
    """The outputs of `streams` as (prompt index, output) pairs, in arrival order; ends once
    every stream has ended. An error raised by one stream is raised here (the others go on
    until `abort()`)."""

    def __init__(self, request_id: str, streams: list[RequestStream]) -> None:
        self.request_id = request_id
        self.streams = streams
        self._queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        self._open = len(streams)
        self._pumps = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(streams)]
        # An error `drain_ready` took off the queue: raised by the next `__anext__`, before the
        # items queued after it (its stream's end among them).
        self._held_error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Every stream has ended and its outputs have been read."""
        return self._open == 0 and self._queue.empty()

    async def _pump(self, index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                self._queue.put_nowait((index, output))
        except Exception as exc:  # the engine's error for this request: the handler's to send
            self._queue.put_nowait((index, exc))
        self._queue.put_nowait((index, _END))

    def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        if self._held_error is not None:
            error, self._held_error = self._held_error, None
            raise error
        while self._open:
            index, item = await self._queue.get()
            if item is _END:
                self._open -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            return index, item  # type: ignore[return-value]
        raise StopAsyncIteration

    def drain_ready(self) -> list[tuple[int, RequestOutput]]:
        """Outputs already queued (no waiting): lets a slow client catch up in one write."""
        ready = []
        while not self._queue.empty():
            index, item = self._queue.get_nowait()
            if item is _END:
                self._open -= 1
                continue
            if isinstance(item, BaseException):
                self._held_error = item  # raised by the next __anext__
                break
            ready.append((index, item))
        return ready

    def abort(self) -> None:
        """Abort every request still running; idempotent."""
        for stream in self.streams:
            stream.abort()
        for pump in self._pumps:
            pump.cancel()

    async def finals(self) -> list[RequestOutput]:
        """Each prompt's finished output, in prompt order."""
        last: list[RequestOutput | None] = [None] * len(self.streams)
        async for index, output in self:
            last[index] = output
        assert all(o is not None for o in last)
        return last  # type: ignore[return-value]
