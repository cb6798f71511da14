"""`nanovllm viz --connect URL`: the visualizer's state from a live server's event stream.

Oracle: the server's own engine. The server has already served requests when the viewer
connects (blocks cached, the free queue reordered) and one request is still running: the
state rebuilt from the stream (its `EngineSnapshot`, then events) must agree with the engine's
block by block, in the free queue's order, and on the scheduler's counters.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from nanovllm import LLMEngine
from nanovllm.config import EngineConfig
from nanovllm.core.block_hash import short
from nanovllm.events import EngineSnapshot
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread
from nanovllm.viz.connect import ConnectDriver

SHARED = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def complete(url: str, prompt: str, max_tokens: int) -> None:
    r = httpx.post(
        url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_connect_to_a_busy_server_starts_from_its_state(tiny_llama) -> None:
    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=40, max_num_seqs=4)
    )
    # 10 ms a step, so the long request below is still running when the viewer connects.
    execute = engine.runner.execute
    engine.runner.execute = lambda out: (time.sleep(0.01), execute(out))[1]
    async_engine = AsyncLLMEngine(engine)
    server = ServerThread(build_app(async_engine)).start()
    states = []
    driver = ConnectDriver(
        server.url, lambda state, status: states.append((state, status)), speed=0
    )
    worker = threading.Thread(target=driver.run, daemon=True)
    try:
        # Served before anyone watches: cached prefixes, a reordered free queue.
        for suffix in ("JULIET:", "NURSE:", "ROMEO:"):
            complete(server.url, SHARED + suffix, 5)
        # One still running when the viewer connects.
        long_one = threading.Thread(target=complete, args=(server.url, SHARED + "Ay me", 100))
        long_one.start()
        wait_for(lambda: async_engine.stats.num_running == 1, "the long request to run")
        worker.start()
        wait_for(lambda: states and states[-1][0].num_blocks, "the snapshot")
        first = states[-1][0]
        kv = engine.kv_cache_manager
        assert first.running, "the snapshot carries the running request"
        assert sum(b.cached for b in first.blocks) > 0
        long_one.join(60)
        wait_for(
            lambda: states[-1][0].finished and not states[-1][0].running,
            "the viewer to see the long request finish",
        )
        assert async_engine.sync()
        state, status = states[-1]
        assert status.error is None
        assert any(isinstance(e, EngineSnapshot) for e in driver.tape.steps[0])
        assert state.num_blocks == kv.num_blocks
        assert list(state.free_queue) == [
            b.block_id for b in kv.free_block_queue.get_all_free_blocks()
        ]
        for block, mine in zip(kv.blocks, state.blocks, strict=True):
            assert mine.ref_count == block.ref_cnt, block
            expected = short(block.block_hash) if block.block_hash else None
            assert mine.block_hash == expected, block
        scheduler = engine.scheduler
        assert state.step == scheduler.step_count
        assert state.metrics.num_preemptions == scheduler.num_preemptions
        assert state.metrics.prefix_hits == scheduler.prefix_cache_hits > 0
        assert state.metrics.prefix_queries == scheduler.prefix_cache_queries
    finally:
        driver.stop()
        worker.join(10)
        server.stop()
        async_engine.shutdown()


def test_connect_to_a_server_with_an_api_key(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=40))
    async_engine = AsyncLLMEngine(engine)
    server = ServerThread(build_app(async_engine, api_key="sesame")).start()
    try:
        without = ConnectDriver(server.url, lambda state, status: None, speed=0)
        with pytest.raises(ConnectionError, match="401.*--api-key"):
            without.setup()
        without.close()
        states = []
        driver = ConnectDriver(
            server.url, lambda state, status: states.append(state), speed=0, api_key="sesame"
        )
        worker = threading.Thread(target=driver.run, daemon=True)
        worker.start()
        wait_for(lambda: states and states[-1].num_blocks, "the snapshot")
        assert states[-1].num_blocks == engine.kv_cache_manager.num_blocks
        driver.stop()
        worker.join(10)
    finally:
        server.stop()
        async_engine.shutdown()
