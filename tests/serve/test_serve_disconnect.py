"""Clients that leave mid-request: their requests are aborted and every KV block comes back."""

from __future__ import annotations

import asyncio

import httpx
import openai
from serve_support import PROMPTS, wait_idle

LONG = 480  # tokens: far more than a client reads before it leaves


def body(async_engine, prompt, max_tokens: int, stream: bool) -> dict:
    return {
        "model": async_engine.model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def test_streams_closed_mid_way_are_aborted_and_free_their_blocks(
    server, async_engine, offline_texts
):
    wait_idle(async_engine)
    aborted_before = async_engine.stats.finished.get("abort", 0)
    leavers = 8

    async def leave_early(client: httpx.AsyncClient, prompt) -> int:
        chunks = 0
        async with client.stream(
            "POST", "/v1/completions", json=body(async_engine, prompt, LONG, True)
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    chunks += 1
                    if chunks == 2:
                        break  # leaving the block closes the connection
        return chunks

    async def stay(client: httpx.AsyncClient, prompt) -> str:
        response = await client.post("/v1/completions", json=body(async_engine, prompt, 24, False))
        return response.json()["choices"][0]["text"]

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(leave_early(client, p) for p in PROMPTS[:leavers]),
                *(stay(client, p) for p in PROMPTS[leavers:]),
            )

    results = asyncio.run(main())
    assert results[:leavers] == [2] * leavers
    assert results[leavers:] == offline_texts[leavers:]  # the others were not disturbed
    wait_idle(async_engine)
    assert async_engine.stats.finished.get("abort", 0) - aborted_before == leavers
    # The engine thread is idle (blocked on its queue), so reading the engine is safe here.
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0
    assert not async_engine.engine.has_unfinished_requests()


def test_openai_client_closing_a_stream_aborts_it(server, async_engine):
    wait_idle(async_engine)
    aborted_before = async_engine.stats.finished.get("abort", 0)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    response = client.completions.create(
        model=async_engine.model_name,
        prompt=PROMPTS[0],
        max_tokens=LONG,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(response):
        if i == 1:
            break
    response.close()
    wait_idle(async_engine)
    assert async_engine.stats.finished.get("abort", 0) == aborted_before + 1
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0


def test_non_streaming_client_that_leaves_is_aborted(server, async_engine):
    """Nothing is written to a non-streaming client until the end: the server must watch."""
    wait_idle(async_engine)
    aborted_before = async_engine.stats.finished.get("abort", 0)
    leavers = 6

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            tasks = [
                asyncio.create_task(
                    client.post("/v1/completions", json=body(async_engine, p, LONG, False))
                )
                for p in PROMPTS[:leavers]
            ]
            # Leave once all are running in the engine (cancelling closes the connections).
            while async_engine.stats.num_running < leavers:
                assert not any(t.done() for t in tasks), "a request ended before we left"
                await asyncio.sleep(0.005)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    wait_idle(async_engine)
    assert async_engine.stats.finished.get("abort", 0) - aborted_before == leavers
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0
