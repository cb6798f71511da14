"""`GET /metrics`: the engine in Prometheus' format, with vLLM's metric names.

Every name is vLLM's (`vllm/v1/metrics/loggers.py`) with `nanovllm:` in place of `vllm:`, and
the histograms use vLLM's buckets, so a dashboard built for vLLM (its Grafana dashboard, say)
works here after replacing `vllm:` with `nanovllm:`. Every sample carries a `model_name` label,
as vLLM's do. Names that vLLM does not have are marked (ours).

State right now (gauges) and running totals (counters), read at scrape time from the engine
thread's `EngineStats` snapshot:

    nanovllm:num_requests_running              gauge     requests in the running batch
    nanovllm:num_requests_waiting              gauge     requests waiting to be admitted
    nanovllm:kv_cache_usage_perc               gauge     used KV blocks / all KV blocks (0-1)
    nanovllm:prompt_tokens_total               counter   prompt tokens of accepted requests
    nanovllm:generation_tokens_total           counter   generated tokens
    nanovllm:num_preemptions_total             counter   requests that lost their KV blocks
    nanovllm:prefix_cache_queries_total        counter   prompt tokens looked up in the cache
    nanovllm:prefix_cache_hits_total           counter   ... and found there
    nanovllm:external_prefix_cache_hits_total  counter   prompt tokens a KV connector supplied
                                                         (`--kv-transfer-config`)
    nanovllm:request_success_total             counter   finished requests by finished_reason
    nanovllm:kv_cache_used_blocks              gauge     (ours)
    nanovllm:kv_cache_total_blocks             gauge     (ours)
    nanovllm:kv_cache_cached_free_blocks       gauge     (ours) free blocks holding a prefix
    nanovllm:generation_tokens_per_second      gauge     (ours) over the last 10 s
    nanovllm:engine_steps_total                counter   (ours)
    nanovllm:engine_errors_total               counter   (ours) steps that raised
    nanovllm:event_subscribers                 gauge     (ours) /v1/events listeners

When the engine speculates (`--speculative-config`), vLLM's four counters of speculative
decoding too (`LLMEngine.spec_stats`, vLLM's `vllm/v1/spec_decode/metrics.py`):

    nanovllm:spec_decode_num_drafts_total                   verifications of proposed tokens
    nanovllm:spec_decode_num_draft_tokens_total             tokens proposed
    nanovllm:spec_decode_num_accepted_tokens_total          ... and accepted
    nanovllm:spec_decode_num_accepted_tokens_per_pos_total  drafts whose proposal at
                                                            `position` (0..k-1) was accepted

Per request (histograms), observed as the engine thread measures them (see stats.py for
exactly what each interval is; requests that finish with "stop" or "length", not aborts):

    nanovllm:time_to_first_token_seconds       one per request, at its first token
    nanovllm:inter_token_latency_seconds       one per token after the first
    nanovllm:e2e_request_latency_seconds       one per finished request, and so on below
    nanovllm:request_queue_time_seconds
    nanovllm:request_prefill_time_seconds
    nanovllm:request_decode_time_seconds
    nanovllm:request_inference_time_seconds
    nanovllm:request_prompt_tokens
    nanovllm:request_generation_tokens
    nanovllm:request_max_num_generation_tokens the longest of the request's n completions
    nanovllm:request_params_n                  the request's `n`
    nanovllm:request_params_max_tokens         its `max_tokens`, as the engine ran it
    nanovllm:time_per_output_token_seconds     vLLM's older name: one per token after the
                                               first, the same values as inter_token_latency
    nanovllm:iteration_tokens_total            one per engine step that produced tokens: the
                                               prompts of requests that got their first token
                                               in it, plus the tokens it generated

And vLLM's `cache_config_info`, a gauge at 1 whose labels are the KV cache's configuration
(`block_size`, `cache_dtype`, `enable_prefix_caching`, `gpu_memory_utilization`,
`num_gpu_blocks`, `num_gpu_blocks_override`, and `engine`: vLLM's labels, no `model_name`).

Each server has its own `CollectorRegistry`, not prometheus_client's global one, so one process
can run several servers (the tests do) without their metrics colliding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from nanovllm.serve.async_engine import AsyncLLMEngine, EngineStats
from nanovllm.serve.stats import IterationStats

PREFIX = "nanovllm:"

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]  # fmt: skip
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM sizes token histograms this way)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class ServerMetrics:
    """One server's metrics: histograms fed by the engine thread, plus the engine's snapshot."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()

        def histogram(name: str, doc: str, buckets: list) -> Histogram:
            metric = Histogram(
                PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry
            )
            return metric.labels(model_name)

        tokens = token_buckets(max_model_len)
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds (= inter_token_latency_seconds).",
            ITL_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        latency = [
            ("e2e_request_latency_seconds", "e2e request latency in seconds."),
            ("request_queue_time_seconds", "time spent waiting in the queue, in seconds."),
            ("request_prefill_time_seconds", "time from scheduling to the first token."),
            ("request_decode_time_seconds", "time from the first token to the last."),
            ("request_inference_time_seconds", "time from scheduling to the last token."),
        ]
        self.e2e, self.queue, self.prefill, self.decode, self.inference = (
            histogram(name, f"Histogram of {doc}", REQUEST_LATENCY_BUCKETS) for name, doc in latency
        )
        self.prompt_tokens = histogram(
            "request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_tokens = histogram(
            "request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = histogram(
            "request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.registry.register(_EngineStateCollector(engine, model_name))
        self.registry.register(_CacheConfigCollector(engine))
        self._remove_observer = engine.add_stats_observer(self.record)

    def record(self, stats: IterationStats) -> None:
        """Runs on the engine thread (prometheus_client's metrics are thread-safe)."""
        for ttft in stats.time_to_first_tokens:
            self.ttft.observe(ttft)
        for itl in stats.inter_token_latencies:
            self.itl.observe(itl)
            self.tpot.observe(itl)
        num_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        if num_tokens:
            self.iteration_tokens.observe(num_tokens)
        for finished in stats.finished_requests:
            self.e2e.observe(finished.e2e_latency)
            self.queue.observe(finished.queued_time)
            self.prefill.observe(finished.prefill_time)
            self.decode.observe(finished.decode_time)
            self.inference.observe(finished.inference_time)
            self.prompt_tokens.observe(finished.num_prompt_tokens)
            self.generation_tokens.observe(finished.num_generation_tokens)
            self.max_generation_tokens.observe(finished.max_num_generation_tokens)
            self.params_n.observe(finished.n)
            if finished.max_tokens is not None:
                self.params_max_tokens.observe(finished.max_tokens)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition and its content type, in the format the scraper's Accept asks for."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def close(self) -> None:
        self._remove_observer()


class _EngineStateCollector:
    """Gauges and counters made at scrape time from the engine thread's latest snapshot."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self._engine = engine
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats
        model = [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            metric = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            metric.add_metric(model, value)
            return metric

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            metric = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            metric.add_metric(model, value)  # exposed as name + "_total"
            return metric

        yield gauge(
            "num_requests_running",
            "Number of requests in model execution batches.",
            stats.num_running,
        )
        yield gauge(
            "num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting
        )
        yield gauge(
            "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage
        )
        yield counter("prompt_tokens", "Prompt tokens of accepted requests.", stats.prompt_tokens)
        yield counter(
            "generation_tokens", "Number of generation tokens processed.", stats.generation_tokens
        )
        yield counter(
            "num_preemptions",
            "Cumulative number of preemption from the engine.",
            stats.num_preemptions,
        )
        yield counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield counter(
            "external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
            stats.external_prefix_cache_hits,
        )
        success = CounterMetricFamily(
            PREFIX + "request_success",
            "Count of finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason, count in sorted({"stop": 0, "length": 0, "abort": 0, **stats.finished}.items()):
            success.add_metric([self._model, reason], count)
        yield success
        if stats.num_speculative_tokens:
            yield from self._spec_decode(stats, counter)
        yield gauge("kv_cache_used_blocks", "KV cache blocks in use.", stats.num_used_blocks)
        yield gauge("kv_cache_total_blocks", "KV cache blocks in all.", stats.num_kv_blocks)
        yield gauge(
            "kv_cache_cached_free_blocks",
            "Free KV cache blocks that still hold a cached prefix.",
            stats.num_cached_free_blocks,
        )
        yield gauge(
            "generation_tokens_per_second",
            "Generated tokens per second over the last 10 seconds.",
            stats.tokens_per_second(),
        )
        yield counter("engine_steps", "Engine steps run.", stats.num_steps)
        yield counter("engine_errors", "Engine steps that raised.", stats.num_engine_errors)
        yield gauge("event_subscribers", "Listeners on /v1/events.", stats.num_event_subscribers)

    def _spec_decode(
        self, stats: EngineStats, counter: Callable[[str, str, float], CounterMetricFamily]
    ) -> Iterator[Metric]:
        """vLLM's speculative decoding counters (vllm/v1/spec_decode/metrics.py)."""
        yield counter(
            "spec_decode_num_drafts",
            "Verifications of proposed tokens (one per request and step with proposals).",
            stats.spec_decode_num_drafts,
        )
        yield counter(
            "spec_decode_num_draft_tokens", "Proposed tokens.", stats.spec_decode_num_draft_tokens
        )
        yield counter(
            "spec_decode_num_accepted_tokens",
            "Proposed tokens accepted.",
            stats.spec_decode_num_accepted_tokens,
        )
        per_pos = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose proposed token at this position was accepted.",
            labels=["model_name", "position"],
        )
        for position, count in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            per_pos.add_metric([self._model, str(position)], count)
        yield per_pos


class _CacheConfigCollector:
    """vLLM's `cache_config_info`: the KV cache's configuration as labels of a gauge at 1."""

    def __init__(self, engine: AsyncLLMEngine) -> None:
        llm_engine = engine.engine
        config = llm_engine.config
        self._labels = {
            "block_size": str(config.block_size),
            "cache_dtype": "auto",  # vLLM's word for: the model's dtype
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "num_gpu_blocks": str(llm_engine.num_kv_blocks),
            "num_gpu_blocks_override": str(config.num_kv_blocks),
        }

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            PREFIX + "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._labels),
        )
        info.add_metric(list(self._labels.values()), 1)
        yield info
