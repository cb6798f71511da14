"""What a server shows about itself: /health, /metrics (vLLM's names) and the live /v1/events."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import PROMPTS, wait_idle

from nanovllm.events import event_from_dict
from nanovllm.serve.api_server import build_app
from nanovllm.serve.server import ServerThread

M = "vllm:"
OURS = "nanovllm:"  # what vLLM does not have


def scrape(server, model: str) -> dict[str, float]:
    """Every sample, parsed by prometheus_client's own parser: name[other labels] -> value,
    every one labelled with the model and engine "0", as vLLM's are. (`cache_config_info` has
    vLLM's labels, no model_name: `cache_config_labels`.)"""
    response = httpx.get(server.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {}
    for family in text_string_to_metric_families(response.text):
        assert family.name.startswith((M, OURS)), family.name
        for sample in family.samples:
            labels = dict(sample.labels)
            if family.name == M + "cache_config_info":
                values[sample.name] = sample.value
                continue
            assert labels.pop("model_name") == model
            assert labels.pop("engine") == "0"
            key = sample.name + (f"[{','.join(labels.values())}]" if labels else "")
            values[key] = sample.value
    return values


def cache_config_labels(server) -> dict[str, str]:
    families = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    (family,) = [f for f in families if f.name == M + "cache_config_info"]
    (sample,) = family.samples
    return dict(sample.labels)


def delta(after: dict, before: dict, name: str, prefix: str = M) -> float:
    return after[prefix + name] - before[prefix + name]


def test_health(server):
    response = httpx.get(server.url + "/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_metrics_count_requests_and_tokens(server, async_engine):
    wait_idle(async_engine)
    before = scrape(server, async_engine.model_name)
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "num_preemptions_total",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
        "request_success_total[length]",
    ):
        assert M + name in before
    prompt = PROMPTS[3] * 6  # long enough to fill a KV block, so the repeat hits the cache
    for _ in range(2):
        response = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True},
            timeout=60,
        )
        assert response.status_code == 200
    # n > 1: every completion's tokens count (they were once left out).
    body = {"prompt": PROMPTS[5], "max_tokens": 4, "n": 3, "temperature": 1, "ignore_eos": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert [len(c["text"]) > 0 for c in response.json()["choices"]] == [True] * 3
    assert response.json()["usage"]["completion_tokens"] == 12
    wait_idle(async_engine)
    after = scrape(server, async_engine.model_name)
    assert delta(after, before, "generation_tokens_total") == 10 + 12
    # n = 3 is three requests, as vLLM counts its three child requests: each counts the prompt.
    assert delta(after, before, "prompt_tokens_total") == 2 * len(prompt) + 3 * len(PROMPTS[5])
    assert delta(after, before, "request_success_total[length]") == 2 + 3
    assert delta(after, before, "prefix_cache_hits_total") > 0
    assert after[OURS + "generation_tokens_per_second"] > 0
    assert after[M + "num_requests_running"] == 0
    assert after[M + "kv_cache_usage_perc"] == 0


def test_latency_histograms_hold_what_was_sent(server, chat_server, async_engine):
    """Counts and sums of every histogram against the requests this test sends."""
    wait_idle(async_engine)
    model = async_engine.model_name
    before = scrape(server, model)
    other_before = scrape(chat_server, model)
    # (prompt length, max_tokens): one streamed; one with a single token (no inter-token gap).
    shapes = [(3, 5), (12, 7), (30, 1)]
    client_latency = 0.0
    for i, (length, max_tokens) in enumerate(shapes):
        body = {
            "prompt": [(5 * i + j) % 200 + 3 for j in range(length)],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": i == 0,
        }
        start = time.monotonic()
        response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        client_latency += time.monotonic() - start
        assert response.status_code == 200
    wait_idle(async_engine)
    after = scrape(server, model)

    def count(name: str) -> float:
        return delta(after, before, name + "_count")

    def total(name: str) -> float:
        return delta(after, before, name + "_sum")

    n = len(shapes)
    for name in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_max_num_generation_tokens",
    ):
        assert count(name) == n, name
        assert delta(after, before, name + "_bucket[+Inf]") == n, name
    assert count("inter_token_latency_seconds") == sum(m - 1 for _, m in shapes)
    assert total("request_prompt_tokens") == sum(length for length, _ in shapes)
    assert total("request_generation_tokens") == sum(m for _, m in shapes)
    # Bucket by bucket (cumulative): prompt lengths 3, 12, 30 and generation lengths 5, 7, 1.
    for le, expected in {"1.0": 0, "2.0": 0, "5.0": 1, "10.0": 1, "20.0": 2, "50.0": 3}.items():
        assert delta(after, before, f"request_prompt_tokens_bucket[{le}]") == expected, le
    for le, expected in {"1.0": 1, "2.0": 1, "5.0": 2, "10.0": 3}.items():
        assert delta(after, before, f"request_generation_tokens_bucket[{le}]") == expected, le
    # The intervals add up: TTFT + inter-token gaps = end to end; queue + prefill = TTFT.
    ttft, itl, e2e = (
        total("time_to_first_token_seconds"),
        total("inter_token_latency_seconds"),
        total("e2e_request_latency_seconds"),
    )
    assert ttft + itl == pytest.approx(e2e, rel=1e-6)
    queue, prefill = total("request_queue_time_seconds"), total("request_prefill_time_seconds")
    assert queue + prefill == pytest.approx(ttft, rel=1e-6)
    assert total("request_decode_time_seconds") == pytest.approx(itl, rel=1e-6, abs=1e-9)
    assert total("request_inference_time_seconds") == pytest.approx(prefill + itl, rel=1e-6)
    # The server saw each request within the time the client waited for it.
    assert 0 < e2e <= client_latency
    assert queue >= 0 and itl > 0
    # A second app on the same engine has its own registry and sees the same engine.
    other = scrape(chat_server, model)
    for name in ("e2e_request_latency_seconds_count", "inter_token_latency_seconds_sum"):
        assert delta(other, other_before, name) == delta(after, before, name)


def test_request_params_and_iteration_tokens_hold_what_was_sent(server, async_engine):
    """vLLM's request_params_n, request_params_max_tokens, iteration_tokens_total and
    request_time_per_output_token_seconds, against the requests this test sends one at a time."""
    wait_idle(async_engine)
    model = async_engine.model_name
    before = scrape(server, model)
    # (prompt length, max_tokens (None: the completions default, 16), n)
    shapes = [(3, 5, 1), (12, None, 1), (7, 4, 2)]
    for i, (length, max_tokens, n) in enumerate(shapes):
        body = {
            "prompt": [(11 * i + j) % 200 + 3 for j in range(length)],
            "n": n,
            "temperature": 0 if n == 1 else 1,  # n > 1 needs sampling (vLLM's rule)
            "ignore_eos": True,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
    wait_idle(async_engine)
    after = scrape(server, model)

    def d(name: str) -> float:
        return delta(after, before, name)

    # A request with n completions is n requests, as vLLM counts its n child requests: each
    # observes its max_tokens, its own tokens and its own time per output token. But n and the
    # most tokens of the n completions are observed once per request (vLLM's parent request;
    # recorded from vLLM: an n=3 request adds 1 to request_params_n_count, 3 to the others).
    sent_max_tokens = [16 if m is None else m for _, m, _ in shapes]
    per_request = [(length, m, n) for (length, _, n), m in zip(shapes, sent_max_tokens)]
    completions = [(length, m, n) for length, m, n in per_request for _ in range(n)]
    assert d("request_params_n_count") == len(per_request) == 3
    assert d("request_params_n_sum") == sum(n for _, _, n in per_request)
    assert d("request_params_n_bucket[1.0]") == 2 and d("request_params_n_bucket[2.0]") == 3
    assert d("request_params_max_tokens_count") == 4
    assert d("request_params_max_tokens_sum") == sum(m for _, m, _ in completions)
    assert d("request_params_max_tokens_bucket[5.0]") == 3  # 5, 4 and 4; 16 is above
    assert d("request_generation_tokens_sum") == sum(m for _, m, _ in completions)
    assert d("request_max_num_generation_tokens_count") == 3
    assert d("request_max_num_generation_tokens_sum") == sum(m for _, m, _ in per_request)
    assert d("request_success_total[length]") == 4
    # One per completion: its decode time over its tokens after the first (4, 15, 3 and 3
    # here), so the sum lies between the decode times' sum / 15 and / 3.
    tpot, decode = (
        d("request_time_per_output_token_seconds_sum"),
        d("request_decode_time_seconds_sum"),
    )
    assert d("request_time_per_output_token_seconds_count") == len(completions)
    assert decode / 15 <= tpot <= decode / 3 and tpot > 0
    # Every step of these requests produced tokens: each completion's prompt (at its first
    # token) + the tokens.
    tokens = sum(length + m for length, m, _ in completions)
    assert d("iteration_tokens_total_sum") == tokens
    assert d("iteration_tokens_total_count") == delta(after, before, "engine_steps_total", OURS)
    decode_steps_of_one_token = sum(
        m - 1 for (_, _, n), m in zip(shapes, sent_max_tokens) if n == 1
    )
    assert d("iteration_tokens_total_bucket[1.0]") == decode_steps_of_one_token


def test_cache_config_info_has_vllms_labels(server, async_engine):
    values = scrape(server, async_engine.model_name)
    assert values[M + "cache_config_info"] == 1
    labels = cache_config_labels(server)
    assert labels == {
        "block_size": "16",  # the EngineConfig default the fixture's engine runs with
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": "0.9",
        "num_gpu_blocks": str(int(values[OURS + "kv_cache_total_blocks"])),
        "num_gpu_blocks_override": "None",
    }


def test_spec_decode_counters_equal_what_the_engine_recorded(model_path, server, async_engine):
    """A server started with speculation exports vLLM's four counters; a plain one none."""
    from nanovllm import EngineConfig, LLMEngine
    from nanovllm.events import SpecTokensVerified
    from nanovllm.serve.async_engine import AsyncLLMEngine

    assert not [k for k in scrape(server, async_engine.model_name) if "spec_decode" in k]
    k = 3
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
            "prompt_lookup_max": 2}  # fmt: skip
    llm_engine = LLMEngine(EngineConfig(model=str(model_path), speculative_config=spec))
    verified: list[SpecTokensVerified] = []  # the oracle of the per-position counts
    llm_engine.subscribe(lambda e: verified.append(e) if e.kind == "spec_tokens_verified" else 0)
    engine = AsyncLLMEngine(llm_engine)
    try:
        with ServerThread(build_app(engine)) as running:
            model = engine.model_name
            per_pos = [M + f"spec_decode_num_accepted_tokens_per_pos_total[{i}]" for i in range(k)]
            before = scrape(running, model)
            assert [before[name] for name in per_pos] == [0] * k
            # One token repeated: this random model then often repeats its own output, so
            # some proposals are accepted and some rejected. One request has n = 2.
            for i, token in enumerate((58, 4, 12, 16)):
                n = 1 + (i == 0)  # (n > 1 needs sampling, as in vLLM)
                body = {"prompt": [token] * 6, "max_tokens": 16, "temperature": n - 1,
                        "seed": 0, "ignore_eos": True, "n": n}  # fmt: skip
                response = httpx.post(running.url + "/v1/completions", json=body, timeout=60)
                assert response.status_code == 200
            wait_idle(engine)
            after = scrape(running, model)
    finally:
        engine.shutdown()
    stats = llm_engine.stats.spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "accepted and rejected"
    assert after[M + "spec_decode_num_drafts_total"] == stats.num_drafts
    assert after[M + "spec_decode_num_draft_tokens_total"] == stats.num_draft_tokens
    assert after[M + "spec_decode_num_accepted_tokens_total"] == stats.num_accepted_tokens
    counts = [after[name] for name in per_pos]
    assert counts == [sum(e.num_accepted > i for e in verified) for i in range(k)]
    assert sum(counts) == stats.num_accepted_tokens


def test_an_app_that_stops_stops_observing(async_engine):
    observers = len(async_engine._stats_observers)
    with ServerThread(build_app(async_engine)):
        assert len(async_engine._stats_observers) == observers + 1
    assert len(async_engine._stats_observers) == observers


def test_events_stream_shows_a_request_from_start_to_finish(server, async_engine):
    wait_idle(async_engine)

    async def main() -> tuple[str, list[dict]]:
        events: list[dict] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("GET", "/v1/events") as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.aiter_lines()
                request_task = None
                async for line in lines:
                    if not line.startswith("data:"):
                        continue
                    events.append(json.loads(line[5:]))
                    if request_task is None:  # subscribed: now send a request
                        request_task = asyncio.create_task(
                            client.post(
                                "/v1/completions",
                                json={"prompt": PROMPTS[4], "max_tokens": 6, "temperature": 0},
                            )
                        )
                    if events[-1]["kind"] == "request_finished":
                        break
                response = await request_task
        return response.json()["id"], events

    request_id, events = asyncio.run(main())
    assert events[0]["kind"] == "engine_started"
    assert events[0]["num_kv_blocks"] == async_engine.engine.num_kv_blocks
    mine = [e for e in events if e.get("request_id") == request_id]
    kinds = [e["kind"] for e in mine]
    assert kinds[0] == "request_added" and kinds[-1] == "request_finished"
    assert "block_allocated" in kinds
    assert kinds.count("token_emitted") == mine[-1]["num_output_tokens"] <= 6
    assert any(e["kind"] == "step_summary" and request_id in e["scheduled"] for e in events)
    for event in events:  # every event rebuilds into its dataclass
        assert event_from_dict(event).kind == event["kind"]
    # The listener left: the engine stops emitting for it.
    deadline = time.monotonic() + 10
    while async_engine.stats.num_event_subscribers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert async_engine.stats.num_event_subscribers == 0
    assert not async_engine.engine.events.active  # no listener: the engine emits nothing


def test_events_alias(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("GET", "/events") as stream:
            first = next(line for line in stream.iter_lines() if line.startswith("data:"))
    assert json.loads(first[5:])["kind"] == "engine_started"


def test_metrics_count_the_tokens_a_kv_connector_supplied(model_path):
    """A device pool too small for three prompts' prefixes and a host tier under it: the first
    prompt, sent again after the other two evicted its blocks, is loaded from the tier; the
    counter equals the scheduler's, and is 0 before that."""
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.serve.async_engine import AsyncLLMEngine

    config = EngineConfig(
        model=str(model_path),
        block_size=4,
        num_kv_blocks=8,
        max_num_seqs=1,
        kv_transfer_config={
            "kv_connector": "OffloadingConnector",
            "kv_connector_extra_config": {"num_cpu_blocks": 64},
        },
    )
    engine = AsyncLLMEngine(LLMEngine(config))
    try:
        with ServerThread(build_app(engine)) as server:
            counts = []
            for i in (0, 1, 2, 0):
                response = httpx.post(
                    server.url + "/v1/completions",
                    json={"prompt": PROMPTS[i] * 4, "max_tokens": 2, "temperature": 0},
                    timeout=60,
                )
                assert response.status_code == 200
                wait_idle(engine)
                counts.append(
                    scrape(server, engine.model_name)[M + "external_prefix_cache_hits_total"]
                )
            assert counts[:3] == [0, 0, 0]
            assert counts[3] > 0
            assert counts[3] == engine.engine.scheduler.external_prefix_cache_hits
            # The same tokens, by source; and what the connector was asked for (past the local
            # hit, at each admission), against the scheduler's own counts.
            values = scrape(server, engine.model_name)
            scheduler = engine.engine.scheduler
            assert values[M + "prompt_tokens_by_source_total[external_kv_transfer]"] == counts[3]
            assert values[M + "prompt_tokens_cached_by_source_total[host]"] == counts[3]
            assert values[M + "prompt_tokens_cached_by_source_total[device]"] == (
                scheduler.prefix_cache_hits
            )
            assert values[M + "external_prefix_cache_queries_total"] == (
                scheduler.prefix_cache_queries - scheduler.prefix_cache_hits
            )
    finally:
        engine.shutdown()
