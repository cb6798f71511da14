"""What a server shows about itself: /health, /metrics and the live /v1/events stream."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
from serve_support import PROMPTS, wait_idle

from nanovllm.events import event_from_dict

SAMPLE = re.compile(r'^(nanovllm_\w+)\{model_name="[^"]*"(?:,(\w+)="([^"]*)")?\} (\S+)$')


def scrape(server) -> dict[str, float]:
    response = httpx.get(server.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {}
    for line in response.text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) nanovllm_\w+ ", line), line
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name, label, label_value, value = match.groups()
        values[f"{name}[{label_value}]" if label else name] = float(value)
    return values


def test_health(server):
    response = httpx.get(server.url + "/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_metrics_count_requests_and_tokens(server, async_engine):
    wait_idle(async_engine)
    before = scrape(server)
    for name in (
        "nanovllm_num_requests_running",
        "nanovllm_num_requests_waiting",
        "nanovllm_kv_cache_usage_ratio",
        "nanovllm_generation_tokens_per_second",
        "nanovllm_num_preemptions_total",
        "nanovllm_prefix_cache_hits_total",
        "nanovllm_prefix_cache_queries_total",
        "nanovllm_request_success_total[length]",
    ):
        assert name in before
    prompt = PROMPTS[3] * 6  # long enough to fill a KV block, so the repeat hits the cache
    for _ in range(2):
        response = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True},
            timeout=60,
        )
        assert response.status_code == 200
    wait_idle(async_engine)
    after = scrape(server)
    assert (
        after["nanovllm_generation_tokens_total"] - before["nanovllm_generation_tokens_total"] == 10
    )
    assert after["nanovllm_prompt_tokens_total"] - before[
        "nanovllm_prompt_tokens_total"
    ] == 2 * len(prompt)
    assert (
        after["nanovllm_request_success_total[length]"]
        - before["nanovllm_request_success_total[length]"]
        == 2
    )
    assert after["nanovllm_prefix_cache_hits_total"] > before["nanovllm_prefix_cache_hits_total"]
    assert after["nanovllm_generation_tokens_per_second"] > 0
    assert after["nanovllm_num_requests_running"] == 0
    assert after["nanovllm_kv_cache_usage_ratio"] == 0


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
