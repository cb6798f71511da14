"""AsyncLLMEngine on its own: sharing, rejection, engine failure and shutdown, no HTTP."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from serve_support import MAX_TOKENS, PROMPTS, greedy, wait_idle

from nanovllm import EngineConfig, LLMEngine
from nanovllm.serve.async_engine import AsyncLLMEngine, EngineDeadError, EngineError


def test_tasks_share_the_engine_and_get_offline_outputs(async_engine, offline_texts):
    async def one(i: int) -> str:
        text = ""
        async for output in async_engine.generate(f"unit-{i}", PROMPTS[i], greedy()):
            text += output.delta_text
            if output.finished:
                assert output.outputs[0].text == text
                assert len(output.outputs[0].token_ids) == MAX_TOKENS
        return text

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(main()) == offline_texts[:8]
    wait_idle(async_engine)


def test_refused_request_raises_and_leaves_nothing(async_engine):
    async def main() -> None:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await async_engine.add_request("bad-1", [10**9], greedy())
        with pytest.raises(ValueError, match="empty"):
            await async_engine.add_request("bad-2", "", greedy())
        # The engine goes on serving.
        stream = await async_engine.add_request("ok-1", PROMPTS[0], greedy(3))
        outputs = [o async for o in stream]
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"

    asyncio.run(main())
    wait_idle(async_engine)


def test_breaking_out_of_generate_aborts(async_engine):
    wait_idle(async_engine)
    aborted = async_engine.stats.finished.get("abort", 0)

    async def main() -> None:
        generation = async_engine.generate("leaver", PROMPTS[0], greedy(400))
        async with contextlib.aclosing(generation) as outputs:
            async for output in outputs:
                if output.outputs[0].token_ids:
                    break
        # Closed: the abort is already on its way, before the request could finish.

    asyncio.run(main())
    wait_idle(async_engine)
    assert async_engine.stats.finished.get("abort", 0) == aborted + 1
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0


@pytest.fixture
def own_engine(model_path):
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(model_path), max_model_len=64)))
    yield engine
    engine.shutdown()


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(own_engine):
    runner = own_engine.engine.runner
    real_execute = runner.execute
    failed = []

    def flaky_execute(sched):
        if len(sched.scheduled) == 3 and not failed:  # once, with all three in the batch
            failed.append(sched.step)
            raise RuntimeError("simulated device error")
        return real_execute(sched)

    runner.execute = flaky_execute  # the engine thread reads it at its next step

    async def main() -> None:
        streams = await asyncio.gather(
            *(own_engine.add_request(f"r{i}", PROMPTS[i], greedy(20)) for i in range(3))
        )
        for stream in streams:
            with pytest.raises(EngineError, match="simulated device error"):
                async for _ in stream:
                    pass
        stream = await own_engine.add_request("after", PROMPTS[0], greedy(4))
        outputs = [o async for o in stream]
        assert len(outputs[-1].outputs[0].token_ids) == 4

    asyncio.run(main())
    wait_idle(own_engine)
    assert own_engine.stats.num_engine_errors == 1
    assert own_engine.engine.kv_cache_manager.num_used_blocks == 0


def test_shutdown_fails_requests_in_flight_and_refuses_new_ones(own_engine):
    async def main() -> None:
        stream = await own_engine.add_request("long", PROMPTS[0], greedy(60))
        await stream.__anext__()
        await asyncio.to_thread(own_engine.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await own_engine.add_request("late", PROMPTS[0], greedy(4))

    asyncio.run(main())
    assert not own_engine.is_alive
