"""The engine generates through the Triton kernels: same greedy tokens as the torch backend.

On a CPU the kernels run through Triton's interpreter (thousands of times slower), so the run is
short: two prompts of different lengths, block size 4 so contexts span several blocks, a token
budget that splits the longer prompt into chunks (chunked prefill), then decode steps.
"""

from __future__ import annotations

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.engine.setup import default_model_path
from nanovllm.kernels.triton_setup import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def test_triton_backend_matches_torch_backend_on_the_embedded_model() -> None:
    if not (default_model_path() / "model.safetensors").is_file():
        pytest.skip("embedded model not built")
    prompts = ["ROMEO:\nBut soft, what light", "JULIET:"]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    options = dict(block_size=4, max_num_batched_tokens=8)
    torch_out = LLM(attention_backend="torch", **options).generate(prompts, params, use_tqdm=False)
    llm = LLM(attention_backend="triton", **options)
    assert llm.llm_engine.started_event.attention_backend == "triton"
    triton_out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in triton_out] == [
        o.outputs[0].token_ids for o in torch_out
    ]


def test_a_block_size_the_kernels_cannot_serve_is_a_clear_error(tiny_llama) -> None:
    with pytest.raises(ValueError, match="block_size=12"):
        LLM(str(tiny_llama), attention_backend="triton", block_size=12)
