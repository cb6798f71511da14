"""`nanovllm viz --connect URL`: the visualizer's state from a live server's event stream.

Oracle: the server's own engine. After a few completion requests through the HTTP API, the
state reduced from the `/v1/events` stream must show them finished and agree with the engine's
figures (every block free again, the free queue in the engine's order).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from nanovllm import LLMEngine
from nanovllm.config import EngineConfig
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.server import ServerThread
from nanovllm.viz.connect import ConnectDriver


def test_connect_driver_follows_a_running_server(tiny_llama) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=64))
    async_engine = AsyncLLMEngine(engine)
    server = ServerThread(build_app(async_engine)).start()
    states = []
    driver = ConnectDriver(
        server.url, lambda state, status: states.append((state, status)), speed=0.0
    )
    worker = threading.Thread(target=driver.run, daemon=True)
    try:
        worker.start()
        deadline = time.monotonic() + 20
        while not (states and states[-1][0].num_blocks) and time.monotonic() < deadline:
            time.sleep(0.05)  # wait for `engine_started`
        for prompt in ("ROMEO:", "JULIET:\nO", "But soft"):
            r = httpx.post(
                server.url + "/v1/completions",
                json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
                timeout=30,
            )
            assert r.status_code == 200
        while time.monotonic() < deadline:
            state = states[-1][0]
            if len(state.finished) >= 3 and not state.running and not state.waiting:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the visualizer never saw the three requests finish")
        assert states[-1][1].error is None
        state = states[-1][0]
        kv = engine.kv_cache_manager
        assert state.num_blocks == kv.num_blocks == 64
        assert list(state.free_queue) == [
            b.block_id for b in kv.free_block_queue.get_all_free_blocks()
        ]
    finally:
        driver.stop()
        worker.join(10)
        server.stop()
        async_engine.shutdown()
