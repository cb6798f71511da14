"""Memory that stays flat: every structure that grows with what the engine serves is bounded.

The measurement is a benchmark (`nanovllm stress --memory`: RSS over 3,000 steps, figures in
nanovllm/bench/README.md); these are its cheap guards, one per structure:

- per-request state (scheduler, KV cache manager, output processor) is gone once the requests
  are, however they ended: length, stop, abort, n > 1, logprobs (the persistent batch's rows
  are bounded by the batch size);
- torch's two oneDNN caches (a matmul primitive per shape of x) are capped before the first
  primitive is made (`backends/cpu_linear.py`);
- the server's per-request timer: tests/serve/test_serve_stats.py.
"""

from __future__ import annotations

import pytest
from torch import nn

from nanovllm import LLMEngine, SamplingParams
from nanovllm.backends import cpu_linear
from nanovllm.bench.tools.stress import soak
from nanovllm.config import EngineConfig

CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def per_request_state(engine: LLMEngine) -> dict[str, int]:
    """The size of every map keyed by request id (all must be 0 with no request left)."""
    kv, out = engine.kv_cache_manager, engine.output_processor
    sizes = {
        "scheduler.requests": len(engine.scheduler.requests),
        "kv.req_to_blocks": len(kv.req_to_blocks),
        "kv.req_to_block_hashes": len(kv.req_to_block_hashes),
        "kv.req_num_cached_blocks": len(kv.req_num_cached_blocks),
        "kv.req_num_filled_slots": len(kv.req_num_filled_slots),
        "kv.req_to_block_ids": len(kv.req_to_block_ids),
        "output.parent_requests": len(out.parent_requests),
        "output._detok": len(out._detok),
        "output._cumulative_logprob": len(out._cumulative_logprob),
        "output._prompt_logprobs": len(out._prompt_logprobs),
    }
    return sizes


def test_no_per_request_state_outlives_its_request(tiny_llama) -> None:
    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=48, max_num_seqs=8)
    )
    soak(engine, 60, seed=3, abort_rate=0.2)  # random sampling, lengths and aborts
    kinds = [
        SamplingParams(n=3, max_tokens=4, temperature=1.0, logprobs=2),
        SamplingParams(max_tokens=4, prompt_logprobs=1, logprobs=0),
        SamplingParams(max_tokens=6, stop=["a", "b", "c", "d", "e"], temperature=1.0),
        SamplingParams(max_tokens=6, detokenize=False),
    ]
    for i, params in enumerate(kinds * 3):
        engine.add_request(f"kind-{i}", [5 + i, 6, 7, 8], params)
    engine.abort_request("kind-4")  # an n = 3 parent, aborted
    engine.run_until_done()
    engine.step()
    sizes = per_request_state(engine)
    assert {name: n for name, n in sizes.items() if n} == {}
    # The persistent batch frees a row when its request is not in the next step: at most a
    # batch's worth of rows is ever held.
    batch = getattr(engine.runner, "input_batch", None)
    assert batch is None or len(batch.row_of) <= engine.config.max_num_seqs


def test_onednn_caches_are_capped_before_the_first_primitive(monkeypatch) -> None:
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    model = nn.Sequential(nn.Linear(8, 8))
    model[0].matmul = lambda x, bias: x  # a layer that multiplies through `matmul`
    cpu_linear.prepack_linear_weights(model)
    capacity = str(cpu_linear.ONEDNN_CACHE_CAPACITY)
    assert [cpu_linear.os.environ.get(name) for name in CACHE_VARIABLES] == [capacity] * 2


@pytest.mark.parametrize("preset", ["0", "4096"])
def test_a_cache_capacity_set_in_the_environment_wins(monkeypatch, preset) -> None:
    for name in CACHE_VARIABLES:
        monkeypatch.setenv(name, preset)
    cpu_linear.bound_onednn_caches()
    assert [cpu_linear.os.environ[name] for name in CACHE_VARIABLES] == [preset] * 2
