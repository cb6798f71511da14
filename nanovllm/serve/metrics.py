"""`GET /metrics`: the engine's state in Prometheus' text exposition format (version 0.0.4).

Written by hand (a dozen lines of text) rather than with `prometheus_client`, so the server has
no extra dependency and the reader sees the whole format. Gauges are the state right now,
counters only grow (Prometheus derives rates from them):

    nanovllm_num_requests_running            gauge    requests in the running batch
    nanovllm_num_requests_waiting            gauge    requests queued for admission
    nanovllm_kv_cache_usage_ratio            gauge    used KV blocks / all KV blocks
    nanovllm_kv_cache_used_blocks            gauge
    nanovllm_kv_cache_total_blocks           gauge
    nanovllm_kv_cache_cached_free_blocks     gauge    free blocks still holding a cached prefix
    nanovllm_generation_tokens_per_second    gauge    over the last 10 s
    nanovllm_prompt_tokens_total             counter
    nanovllm_generation_tokens_total         counter
    nanovllm_num_preemptions_total           counter  requests that lost their blocks
    nanovllm_prefix_cache_queries_total      counter  prompt tokens looked up in the cache
    nanovllm_prefix_cache_hits_total         counter  ... and found there
    nanovllm_request_success_total           counter  by finished_reason (stop, length, abort)
    nanovllm_engine_steps_total              counter
    nanovllm_engine_errors_total             counter  steps that raised
    nanovllm_event_subscribers               gauge    /v1/events listeners

Every sample carries a `model_name` label, as vLLM's do.
"""

from __future__ import annotations

from nanovllm.serve.async_engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(stats: EngineStats, model_name: str) -> str:
    model = f'model_name="{_label(model_name)}"'
    # (name, type, help, value): one sample each.
    simple: list[tuple[str, str, str, float]] = [
        ("num_requests_running", "gauge", "Requests in the running batch.", stats.num_running),
        ("num_requests_waiting", "gauge", "Requests waiting to be admitted.", stats.num_waiting),
        ("kv_cache_usage_ratio", "gauge", "Fraction of KV blocks in use (0-1).", stats.kv_usage),
        ("kv_cache_used_blocks", "gauge", "KV cache blocks in use.", stats.num_used_blocks),
        ("kv_cache_total_blocks", "gauge", "KV cache blocks in all.", stats.num_kv_blocks),
        (
            "kv_cache_cached_free_blocks",
            "gauge",
            "Free KV cache blocks that still hold a cached prefix.",
            stats.num_cached_free_blocks,
        ),
        (
            "generation_tokens_per_second",
            "gauge",
            "Generated tokens per second over the last 10 seconds.",
            stats.tokens_per_second(),
        ),
        (
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of accepted requests.",
            stats.prompt_tokens,
        ),
        ("generation_tokens_total", "counter", "Generated tokens.", stats.generation_tokens),
        (
            "num_preemptions_total",
            "counter",
            "Preemptions: running requests that lost their KV blocks.",
            stats.num_preemptions,
        ),
        (
            "prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries,
        ),
        (
            "prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            stats.prefix_cache_hits,
        ),
        ("engine_steps_total", "counter", "Engine steps run.", stats.num_steps),
        ("engine_errors_total", "counter", "Engine steps that raised.", stats.num_engine_errors),
        ("event_subscribers", "gauge", "Listeners on /v1/events.", stats.num_event_subscribers),
    ]
    lines: list[str] = []
    for name, kind, help_text, value in simple:
        lines += [
            f"# HELP nanovllm_{name} {help_text}",
            f"# TYPE nanovllm_{name} {kind}",
            f"nanovllm_{name}{{{model}}} {_number(value)}",
        ]
    name = "nanovllm_request_success_total"
    lines += [f"# HELP {name} Finished requests by finish reason.", f"# TYPE {name} counter"]
    reasons = {"stop": 0, "length": 0, "abort": 0, **stats.finished}
    for reason, count in sorted(reasons.items()):
        lines.append(f'{name}{{{model},finished_reason="{_label(reason)}"}} {count}')
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))
