"""The server through the official `openai` client: same answers as the offline engine."""

from __future__ import annotations

import asyncio

import openai
import pytest
from serve_support import CHAT_TEMPLATE, MAX_TOKENS, PROMPTS, greedy, wait_idle


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(server, async_engine):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [async_engine.model_name]
    assert client(server).models.retrieve(async_engine.model_name).id == async_engine.model_name
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("no-such-model")


def test_completion_matches_offline_greedy(server, async_engine, offline_texts):
    result = client(server).completions.create(
        model=async_engine.model_name,
        prompt=PROMPTS[0],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert choice.text == offline_texts[0]
    assert choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len(PROMPTS[0])
    assert result.usage.completion_tokens == MAX_TOKENS
    assert result.object == "text_completion"


@pytest.mark.quick
def test_streamed_completion_matches_offline_greedy(server, async_engine, offline_texts):
    stream = client(server).completions.create(
        model=async_engine.model_name,
        prompt=PROMPTS[1],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == offline_texts[1]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_sixteen_concurrent_streams_get_the_offline_outputs(server, async_engine, offline_texts):
    """Every client joins the same engine batch and still gets exactly its own greedy output."""
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    steps_before = async_engine.stats.num_steps

    async def one(prompt, stream: bool) -> str:
        kwargs = dict(
            model=async_engine.model_name,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        if not stream:
            return (await aclient.completions.create(**kwargs)).choices[0].text
        pieces = []
        async for chunk in await aclient.completions.create(stream=True, **kwargs):
            pieces.append(chunk.choices[0].text)
        return "".join(pieces)

    async def main() -> list[str]:
        async with aclient:
            return await asyncio.gather(*(one(p, stream=i % 4 != 0) for i, p in enumerate(PROMPTS)))

    texts = asyncio.run(main())
    assert texts == offline_texts
    # Batched: far fewer steps than 16 requests x 24 tokens run one after another.
    assert async_engine.stats.num_steps - steps_before < len(PROMPTS) * MAX_TOKENS / 2
    wait_idle(async_engine)


def test_string_prompt_stop_and_seed(server, async_engine, offline_llm):
    c = client(server)
    base = dict(model=async_engine.model_name, prompt="To be, or not", max_tokens=12)
    # Seeded sampling is reproducible across requests.
    first = c.completions.create(temperature=1.0, seed=1234, **base).choices[0].text
    again = c.completions.create(temperature=1.0, seed=1234, **base).choices[0].text
    assert first == again
    # A stop string cuts the text before it and finishes with "stop".
    full = c.completions.create(temperature=0, extra_body={"ignore_eos": True}, **base)
    text = full.choices[0].text
    offline = offline_llm.generate(["To be, or not"], greedy(12), use_tqdm=False)
    assert text == offline[0].outputs[0].text
    # A plain-ASCII stop string from the middle of the text (a random model's bytes may not
    # form whole characters, and a stop string should be text).
    stops = [text[i : i + 2] for i in range(2, len(text) - 1) if text[i : i + 2].isascii()]
    if stops:
        stop = stops[0]
        cut = c.completions.create(
            temperature=0, stop=[stop], extra_body={"ignore_eos": True}, **base
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == text[: text.index(stop)]


def test_logprobs(server, async_engine):
    result = client(server).completions.create(
        model=async_engine.model_name,
        prompt=PROMPTS[2],
        max_tokens=5,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for token_logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert token_logprob <= 0 and len(top) <= 3
        assert max(top.values()) == pytest.approx(token_logprob)  # greedy: the top token


def test_chat_without_template_is_a_clear_400(server, async_engine):
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(
            model=async_engine.model_name, messages=[{"role": "user", "content": "hi"}]
        )
    error = info.value.body
    assert error["param"] == "messages" and error["code"] == "chat_template_missing"
    assert "chat template" in error["message"]


def test_chat_with_template_matches_offline(chat_server, async_engine, offline_llm):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Who goes there?"}]},
    ]
    tokenizer = offline_llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Who goes there?"},
        ],
        chat_template=CHAT_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    expected = offline_llm.generate([{"prompt_token_ids": ids}], greedy(10), use_tqdm=False)
    expected_text = expected[0].outputs[0].text

    c = client(chat_server)
    kwargs = dict(
        model=async_engine.model_name,
        messages=messages,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    reply = c.chat.completions.create(**kwargs)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected_text
    assert reply.usage.prompt_tokens == len(ids)

    chunks = list(c.chat.completions.create(stream=True, logprobs=True, top_logprobs=2, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected_text
    assert chunks[-1].choices[0].finish_reason == "length"
    content = [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert len(content) == 10 and all(len(t.top_logprobs) <= 2 for t in content)


def test_n_completions_streamed_or_not_match_offline(chat_server, async_engine, offline_llm):
    """`n` > 1: one choice per completion, each equal to the offline engine's child i (seeded),
    whether it comes whole or as a stream of per-choice deltas."""
    from nanovllm import SamplingParams

    n, seed, prompt = 3, 21, PROMPTS[4]
    params = SamplingParams(n=n, temperature=0.9, seed=seed, max_tokens=8, ignore_eos=True)
    expected = offline_llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    expected = [c.text for c in expected[0].outputs]
    assert len(set(expected)) > 1, "the children should differ"
    c = client(chat_server)
    kwargs = dict(
        model=async_engine.model_name,
        prompt=prompt,
        n=n,
        max_tokens=8,
        temperature=0.9,
        seed=seed,
        extra_body={"ignore_eos": True},
    )
    whole = c.completions.create(**kwargs)
    assert [ch.index for ch in whole.choices] == list(range(n))
    assert [ch.text for ch in whole.choices] == expected
    assert whole.usage.completion_tokens == n * 8
    texts, finishes = [""] * n, [None] * n
    for chunk in c.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                assert finishes[ch.index] is None, "a choice finished twice"
                finishes[ch.index] = ch.finish_reason
    assert texts == expected and finishes == ["length"] * n
    chat = c.chat.completions.create(
        model=async_engine.model_name,
        messages=[{"role": "user", "content": "Who goes there?"}],
        n=2,
        max_tokens=4,
        temperature=0.9,
        seed=seed,
    )
    assert [ch.index for ch in chat.choices] == [0, 1]
    wait_idle(async_engine)
    assert async_engine.engine.kv_cache_manager.num_used_blocks == 0
