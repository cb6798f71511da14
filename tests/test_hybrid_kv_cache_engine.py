"""The hybrid KV cache manager end to end: the same greedy tokens as every layer kept full.

A tiny random Llama is given sliding-window layers on nanovllm's side only (its `ModelArgs`
wrapped as it is loaded): alternating sliding and full layers (two KV cache groups, a sliding
one and a full one), or every layer sliding (one sliding group). The torch reference honours the
window in attention whichever manager runs, so the oracle is the same model with
`disable_hybrid_kv_cache_manager=True` (one group, every block kept): the hybrid manager frees
the blocks each window leaves behind and serves prefix-cache hits from the last window's
blocks, and greedy output must not change, under the parity suite's scheduling configurations
(block sizes 1 and ones that do not divide the prompts, KV budgets that force preemption,
chunked prefill, prefix caching on and off), with sequences longer than the window. Both runs
get the same KV budget in bytes.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parity import make_prompts
from tiny_models import make_model

import nanovllm.engine.setup as engine_setup
import nanovllm.models.loader as loader
from nanovllm import LLM, SamplingParams
from nanovllm.events import BlockAllocated, BlockFreed, RequestFinished, RequestPreempted
from nanovllm.executor.memory import kv_bytes_per_block

WINDOW = 6
MAX_TOKENS = 6
LAYOUTS = {
    "alternating": ("sliding_attention", "full_attention") * 2,
    "all-sliding": ("sliding_attention",) * 4,
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hybrid"), hidden_size=32, num_layers=4,
                      num_heads=4, num_kv_heads=2, vocab_size=256)  # fmt: skip


@contextmanager
def layer_types(types: tuple[str, ...] | None):
    """Within it, the checkpoint loads with these layer types and WINDOW (None: as saved)."""
    original = loader.load_model_args

    def load(path):
        hf_config, args = original(path)
        if types is None:
            return hf_config, args
        return hf_config, dataclasses.replace(args, layer_types=types, sliding_window=WINDOW)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "load_model_args", load)
        patch.setattr(engine_setup, "load_model_args", load)
        yield


def run(path: Path, prompts: list[list[int]], events: list | None = None, **options):
    llm = LLM(str(path), attention_backend="torch", **options)
    if events is not None:
        llm.llm_engine.events.subscribe(events.append)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    kv = llm.llm_engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks - (kv.block_pool.null_block is not None), "leak"
    return [o.outputs[0].token_ids for o in outs]


engine_configs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 3, 4]),
        "kv_slots": st.sampled_from([64, 96]),  # (every layer full: 64 slots preempts)
        "max_num_batched_tokens": st.sampled_from([7, 17, 2048]),
        "max_num_seqs": st.sampled_from([3, 8]),
        "enable_prefix_caching": st.booleans(),
    }
)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@settings(max_examples=examples(2), deadline=None)
@given(config=engine_configs)
def test_hybrid_manager_gives_the_tokens_of_every_layer_kept_full(
    tiny_llama, layout: str, config: dict
) -> None:
    prompts = [make_prompts(256)[i] for i in (0, 1, 3)]  # (30-33 tokens, two share 20)
    kv_slots, block_size = config.pop("kv_slots"), config["block_size"]
    args = loader.load_model_args(tiny_llama)[1]
    budget = kv_slots // block_size * kv_bytes_per_block(args, block_size, torch.float32)
    options = dict(config, kv_cache_memory_bytes=budget, max_model_len=128)
    events: list = []
    with layer_types(LAYOUTS[layout]):
        hybrid = run(tiny_llama, prompts, events, **options)
        full = run(tiny_llama, prompts, disable_hybrid_kv_cache_manager=True, **options)
    assert hybrid == full
    assert windows_freed_blocks(events)


def windows_freed_blocks(events: list) -> bool:
    """Whether some request gave a block back and then took another while it still ran (a
    block its window left behind: nothing else frees a running request's block here)."""
    gave_back: set[str] = set()
    for e in events:
        if isinstance(e, BlockFreed):
            gave_back.add(e.request_id)
        elif isinstance(e, (RequestPreempted, RequestFinished)):
            gave_back.discard(e.request_id)
        elif isinstance(e, BlockAllocated) and e.request_id in gave_back:
            return True
    return False


def test_windows_change_the_tokens(tiny_llama) -> None:
    """The sliding layers do attend within their windows (else the test above proves little):
    the same checkpoint without windows answers differently."""
    prompts = make_prompts(256)[:2]
    plain = run(tiny_llama, prompts, block_size=4, num_kv_blocks=200)
    with layer_types(LAYOUTS["alternating"]):
        windowed = run(tiny_llama, prompts, block_size=4, num_kv_blocks=200)
    assert plain != windowed
