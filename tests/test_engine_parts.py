"""The engine is built from its parts (`nanovllm/engine/parts.py`): each part given in
`EngineParts` is the one the built engine uses, and the engine serves the same tokens with
parts that compute what its own compute. A part the engine cannot use is refused, named.

Oracle: the engine built from its own parts, on the same requests.
"""

from __future__ import annotations

import functools

import pytest

from nanovllm.core.free_block_queue import FreeBlockQueue
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler
from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.engine.parts import EngineParts
from nanovllm.executor.sampler import Sampler
from nanovllm.executor.step_inputs import step_inputs
from nanovllm.lessons.demo_support import make_engine
from nanovllm.lessons.workload import make_workload
from nanovllm.lessons.your_engine import serve
from nanovllm.models.attention import TorchAttention
from nanovllm.models.linear import RowParallelLinear
from nanovllm.models.model_layers import ModelLayers


class CountingScheduler(Scheduler):
    steps = 0

    def schedule(self):
        CountingScheduler.steps += 1
        return super().schedule()


class MyQueue(FreeBlockQueue):
    pass


class MyKV(KVCacheManager):
    pass


class MyAttention(TorchAttention):
    pass


class MyDetokenizer(IncrementalDetokenizer):
    pass


class MyRowParallelLinear(RowParallelLinear):
    pass


def my_model_layers(attention: type) -> ModelLayers:
    return ModelLayers(attention, row=MyRowParallelLinear)


def my_step_inputs(out, block_size):
    my_step_inputs.calls += 1
    return step_inputs(out, block_size)


my_step_inputs.calls = 0


def test_every_part_given_is_the_one_the_engine_uses_and_the_tokens_are_the_same() -> None:
    parts = EngineParts(
        free_block_queue=MyQueue,
        kv_cache_manager_cls=MyKV,
        scheduler_cls=CountingScheduler,
        step_inputs=my_step_inputs,
        attention_cls=MyAttention,
        sampler=functools.partial(Sampler),
        detokenizer=MyDetokenizer,
        model_layers=my_model_layers,
    )
    arrivals = make_workload("short")
    stock = make_engine()
    want = {rid: out.outputs[0].token_ids for rid, out in serve(stock, arrivals).items()}
    engine = make_engine(parts=parts)
    assert type(engine.kv_cache_manager) is MyKV
    assert type(engine.kv_cache_manager.free_block_queue) is MyQueue
    assert type(engine.scheduler) is CountingScheduler
    assert type(engine.output_processor.detokenizer) is MyDetokenizer
    for layer in engine.runner.model.model.layers:
        assert type(layer.self_attn.attn) is MyAttention
        assert type(layer.self_attn.o_proj) is type(layer.mlp.down_proj) is MyRowParallelLinear
    got = {rid: out.outputs[0].token_ids for rid, out in serve(engine, arrivals).items()}
    assert got == want
    assert CountingScheduler.steps > 0 and my_step_inputs.calls > 0


def test_a_part_the_engine_cannot_use_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="keeps no host tier"):
        make_engine(
            kv_transfer_config={
                "kv_connector": "SharedStorageConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
            },
            parts=EngineParts(host_tier_cls=dict),
        )
    pytest.importorskip("triton")  # (the Triton backend's runner, built on the CPU)
    with pytest.raises(ValueError, match="builds its step inputs its own way"):
        make_engine(attention_backend="triton", parts=EngineParts(step_inputs=my_step_inputs))


class MySampler(Sampler):
    pass


def test_the_sampler_part_is_used_on_the_fast_backend_too() -> None:
    """The CPU backend's runner samples with its fast sampler unless a part is given: then the
    part's, as the plain runner does."""
    from nanovllm.backends.sampler import FastSampler

    assert type(make_engine(attention_backend="cpu").runner.sampler) is FastSampler
    assert type(make_engine(attention_backend="torch").runner.sampler) is Sampler
    for backend in ("cpu", "torch"):
        engine = make_engine(attention_backend=backend, parts=EngineParts(sampler=MySampler))
        assert type(engine.runner.sampler) is MySampler
