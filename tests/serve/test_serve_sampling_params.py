"""vLLM's logits-processing fields over HTTP: the server's output equals the offline engine's
with the same `SamplingParams` (string `logit_bias` keys included), on both endpoints."""

from __future__ import annotations

import httpx
from serve_support import PROMPTS, wait_idle

from nanovllm import SamplingParams

FIELDS = [
    dict(logit_bias={"40": 6.0, "41": -100}, presence_penalty=1.5, frequency_penalty=0.5),
    dict(repetition_penalty=0.5, min_tokens=8),
    dict(allowed_token_ids=[40, 41, 42], bad_words=["ab"]),
]


def offline(offline_llm, prompt, fields: dict) -> str:
    bias = {int(k): v for k, v in (fields.get("logit_bias") or {}).items()}
    params = SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, **{**fields, "logit_bias": bias or None}
    )
    return offline_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].text


def test_completions_take_the_fields(server, async_engine, offline_llm) -> None:
    wait_idle(async_engine)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i, fields in enumerate(FIELDS):
            body = dict(
                model=async_engine.model_name,
                prompt=PROMPTS[i],
                max_tokens=12,
                temperature=0,
                ignore_eos=True,
                **fields,
            )
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            text = response.json()["choices"][0]["text"]
            assert text == offline(offline_llm, {"prompt_token_ids": PROMPTS[i]}, fields)
            plain = offline(offline_llm, {"prompt_token_ids": PROMPTS[i]}, {})
            assert text != plain  # (each set of fields changes the output)


def test_chat_completions_take_the_fields(chat_server, async_engine, offline_llm) -> None:
    """A bias of 100 on one token (a string key, as OpenAI's clients send it) makes greedy
    decoding emit only that token."""
    wait_idle(async_engine)
    with httpx.Client(base_url=chat_server.url, timeout=60) as client:
        body = dict(
            model=async_engine.model_name,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=12,
            temperature=0,
            ignore_eos=True,
            logit_bias={"40": 100},
            presence_penalty=0.5,
        )
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
    assert text == offline_llm.llm_engine.tokenizer.decode([40] * 12)


def test_prompt_logprobs_in_the_response(server, async_engine, offline_llm) -> None:
    wait_idle(async_engine)
    prompt = PROMPTS[5]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        body = dict(
            model=async_engine.model_name,
            prompt=prompt,
            max_tokens=2,
            temperature=0,
            prompt_logprobs=2,
        )
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        got = response.json()["choices"][0]["prompt_logprobs"]
        refused = client.post("/v1/completions", json={**body, "stream": True})
        assert refused.status_code == 400 and "prompt_logprobs" in refused.text
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    want = offline_llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert got[0] is None and len(got) == len(prompt)
    for entry, expected in zip(got[1:], want.prompt_logprobs[1:]):
        assert {int(t) for t in entry} == set(expected)
        for t, lp in expected.items():
            assert entry[str(t)]["logprob"] == lp.logprob
            assert entry[str(t)]["rank"] == lp.rank
            assert entry[str(t)]["decoded_token"] == lp.decoded_token
