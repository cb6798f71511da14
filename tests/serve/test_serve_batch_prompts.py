"""`/v1/completions` with a batch of prompts: one choice per prompt per `n`, as vLLM answers.

Oracle: the offline engine (seeded sampling is a function of the prompt and the seed, so prompt
i's completions in a batch are the offline engine's completions of prompt i alone), and vLLM's
numbering (`completion/serving.py`, `completion_stream_generator`: choice index
`prompt_index * n + output.index`; usage summed over prompts and completions).
"""

from __future__ import annotations

import json

import httpx
import openai
from serve_support import PROMPTS, wait_idle

from nanovllm import SamplingParams

N, SEED, MAX = 2, 5, 6


def _expected(offline_llm, prompts: list[list[int]]) -> list[str]:
    """Prompt-major: prompt 0's n completions, then prompt 1's, ..."""
    params = SamplingParams(n=N, temperature=0.9, seed=SEED, max_tokens=MAX, ignore_eos=True)
    outputs = offline_llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )
    return [c.text for o in outputs for c in o.outputs]


def test_a_batch_of_token_id_prompts_streamed_or_not(server, async_engine, offline_llm):
    prompts = PROMPTS[5:8]
    expected = _expected(offline_llm, prompts)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    kwargs = dict(
        model=async_engine.model_name,
        prompt=prompts,
        n=N,
        max_tokens=MAX,
        temperature=0.9,
        seed=SEED,
        extra_body={"ignore_eos": True},
    )
    whole = c.completions.create(**kwargs)
    assert [ch.index for ch in whole.choices] == list(range(len(prompts) * N))
    assert [ch.text for ch in whole.choices] == expected
    assert whole.usage.prompt_tokens == sum(len(p) for p in prompts)
    assert whole.usage.completion_tokens == len(prompts) * N * MAX
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    texts, finishes, usage = [""] * len(expected), [None] * len(expected), None
    for chunk in c.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    ):
        assert len(chunk.choices) <= 1, "one choice per chunk, as vLLM sends them"
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                assert finishes[ch.index] is None, "a choice finished twice"
                finishes[ch.index] = ch.finish_reason
        usage = chunk.usage or usage
    assert texts == expected and finishes == ["length"] * len(expected)
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    wait_idle(async_engine)


def test_a_batch_of_text_prompts_with_echo(server, async_engine, model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    texts = ["Hello", "The quick brown fox"]
    body = {
        "model": async_engine.model_name,
        "prompt": texts,
        "max_tokens": 3,
        "temperature": 0,
        "echo": True,
        "ignore_eos": True,
    }
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [ch["index"] for ch in reply["choices"]] == [0, 1]
    for prompt, choice in zip(texts, reply["choices"]):
        assert choice["text"].startswith(prompt)
    # The stream echoes each prompt once, in the first chunk of its choice, with its token ids.
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    firsts: dict[int, dict] = {}
    streamed = ["", ""]
    for line in lines:
        (choice,) = json.loads(line[len("data: ") :])["choices"]
        firsts.setdefault(choice["index"], choice)
        streamed[choice["index"]] += choice["text"]
    assert streamed == [ch["text"] for ch in reply["choices"]]
    for i, prompt in enumerate(texts):
        assert firsts[i]["text"].startswith(prompt)
        assert firsts[i]["prompt_token_ids"] == tokenizer.encode(prompt)
    wait_idle(async_engine)


def test_a_bad_prompt_in_a_batch_leaves_nothing_running(server, async_engine):
    body = {
        "model": async_engine.model_name,
        "prompt": [PROMPTS[0], [10**9]],  # the second id is outside the vocabulary
        "max_tokens": 4,
    }
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    wait_idle(async_engine)
    too_many = {**body, "prompt": [PROMPTS[0]] * 200, "n": 2}
    response = httpx.post(server.url + "/v1/completions", json=too_many, timeout=60)
    assert response.status_code == 400 and "400 completions" in response.json()["error"]["message"]


def test_a_batch_stream_closed_mid_way_aborts_every_prompt(server, async_engine):
    """Leaving a batch's stream aborts all of its requests (each prompt's n completions count
    as aborted, as vLLM counts its child requests) and frees their blocks."""
    wait_idle(async_engine)
    aborted_before = async_engine.stats.finished.get("abort", 0)
    body = {
        "model": async_engine.model_name,
        "prompt": PROMPTS[:3],
        "n": 2,
        "max_tokens": 400,
        "temperature": 1,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # leaving the block closes the connection
    wait_idle(async_engine)
    assert async_engine.stats.finished.get("abort", 0) - aborted_before == 3 * 2
