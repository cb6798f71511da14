"""`GET /metrics`: the engine in Prometheus' format, under vLLM's metric names.

Every family whose figure the engine has is vLLM's (`vllm/v1/metrics/loggers.py`, vLLM 0.32):
the same `vllm:` name, type, label names (`model_name` and `engine`, "0": one engine) and
histogram buckets, so a dashboard or alert written for `vllm serve` (vLLM's Grafana dashboard,
say) finds the same series here. `tests/vllm_reference/metric_families.json` is vLLM's list,
recorded from its own stat logger; tests/serve/test_serve_vllm_metrics.py compares the two.
What nanovllm shows beyond vLLM keeps the `nanovllm:` prefix, so no `vllm:` name means
something vLLM's does not. (The old `nanovllm:` copies of vLLM's families are gone: two names
for one series would double every dashboard's sums.)

State right now (gauges) and running totals (counters), read at scrape time from the engine
thread's `ServerStats` snapshot:

    vllm:num_requests_running                 gauge     requests in the running batch
    vllm:num_requests_waiting                 gauge     requests waiting to be admitted
    vllm:num_requests_waiting_by_reason       gauge     {reason}: "capacity" (all of them:
                                                        nanovllm defers nobody), "deferred" (0)
    vllm:engine_sleep_state                   gauge     {sleep_state}: awake 1 (no sleep mode)
    vllm:kv_cache_usage_perc                  gauge     used KV blocks / all KV blocks (0-1)
    vllm:prompt_tokens_total                  counter   prompt tokens of accepted requests
    vllm:generation_tokens_total              counter   generated tokens
    vllm:num_preemptions_total                counter   requests that lost their KV blocks
    vllm:prefix_cache_queries_total           counter   prompt tokens looked up in the cache
    vllm:prefix_cache_hits_total              counter   ... and found there
    vllm:external_prefix_cache_queries_total  counter   prompt tokens a KV connector was asked
                                                        for (those past the local hit)
    vllm:external_prefix_cache_hits_total     counter   ... and supplied
    vllm:prompt_tokens_cached_by_source_total counter   {source}: the hits above, by tier:
                                                        "device" the prefix cache, the
                                                        connector's own ("host", "p2p", "disk")
    vllm:request_success_total                counter   finished requests by finished_reason
    vllm:cache_config_info                    gauge     1; the KV cache's configuration as
                                                        labels (vLLM's, no model_name)

Estimated on the engine thread for every step, as vLLM estimates them (perf.py): its FLOPs,
and the bytes it reads and writes (`rate(...[1m]) / 1e12` is TFLOP/s):

    vllm:estimated_flops_per_gpu_total         counter
    vllm:estimated_read_bytes_per_gpu_total    counter
    vllm:estimated_write_bytes_per_gpu_total   counter

Counted on the engine thread, as each request is first scheduled (stats.py):

    vllm:prompt_tokens_cached_total           counter   its prompt tokens the model did not
                                                        compute (prefix cache + connector)
    vllm:prompt_tokens_by_source_total        counter   {source}: "local_compute",
                                                        "local_cache_hit", "external_kv_transfer"

When the engine speculates (`--speculative-config`), vLLM's four counters of speculative
decoding too (`LLMEngine.stats.spec_decoding`, vLLM's `vllm/v1/spec_decode/metrics.py`):

    vllm:spec_decode_num_drafts_total                   verifications of proposed tokens
    vllm:spec_decode_num_draft_tokens_total             tokens proposed
    vllm:spec_decode_num_accepted_tokens_total          ... and accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total  drafts whose proposal at
                                                        `position` (0..k-1) was accepted

Per request (histograms), observed as the engine thread measures them (see stats.py for
exactly what each interval is; requests that finish with "stop" or "length", not aborts):

    vllm:time_to_first_token_seconds          one per request, at its first token
    vllm:inter_token_latency_seconds          one per token after the first
    vllm:e2e_request_latency_seconds          one per finished request, and so on below
    vllm:request_queue_time_seconds
    vllm:request_prefill_time_seconds
    vllm:request_decode_time_seconds
    vllm:request_inference_time_seconds
    vllm:request_time_per_output_token_seconds  decode time / (tokens - 1)
    vllm:request_prompt_tokens
    vllm:request_generation_tokens
    vllm:request_prefill_kv_computed_tokens   prompt tokens minus the cached ones
    vllm:request_num_preemptions              times it was preempted
    vllm:request_max_num_generation_tokens    the longest of the request's n completions
    vllm:request_params_n                     the request's `n`
    vllm:request_params_max_tokens            its `max_tokens`, as the engine ran it
    vllm:iteration_tokens_total               one per engine step that produced tokens: the
                                              prompts of requests that got their first token
                                              in it, plus the tokens it generated

Counted by the chat route when the server has a tool-call parser (`--tool-call-parser`), as
vLLM's `vllm/parser/metrics.py` counts (`ToolParserInvocations`):

    vllm:tool_call_parser_invocations_total   counter   {mode, outcome, request_type}: each
                                                        call of the parser on a choice's whole
                                                        output, or on a streamed delta

Ours (`nanovllm:`): kv_cache_used_blocks, kv_cache_total_blocks, kv_cache_cached_free_blocks,
generation_tokens_per_second (last 10 s), engine_steps_total, engine_errors_total,
event_subscribers.

Each server has its own `CollectorRegistry`, not prometheus_client's global one, so one process
can run several servers (the tests do) without their metrics colliding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from nanovllm.serve.async_engine import AsyncLLMEngine, ServerStats
from nanovllm.serve.perf import ModelShape
from nanovllm.serve.stats import IterationStats

PREFIX = "vllm:"  # vLLM's families
OURS = "nanovllm:"  # what vLLM does not have
LABELS = ["model_name", "engine"]  # vLLM's; `engine` is "0": one engine per server
ENGINE = "0"

# vLLM's buckets (vllm/v1/metrics/buckets.py).
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
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
# vLLM's label values (FinishReason, PromptTokenStats.ALL_SOURCES, CacheHitSource): all are
# exported from the start, at 0, as vLLM's are.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
# The tier each of nanovllm's KV connectors keeps its blocks in (vLLM's CacheHitSource).
CONNECTOR_SOURCE = {
    "OffloadingConnector": "host",
    "P2pConnector": "p2p",
    "SharedStorageConnector": "disk",
}


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
        labels = [model_name, ENGINE]

        def histogram(name: str, doc: str, buckets: list) -> Histogram:
            metric = Histogram(PREFIX + name, doc, LABELS, buckets=buckets, registry=self.registry)
            return metric.labels(*labels)

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
            "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
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
        self.num_preemptions = histogram(
            "request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        cached = Counter(
            PREFIX + "prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            LABELS,
            registry=self.registry,
        )
        self.prompt_tokens_cached = cached.labels(*labels)
        by_source = Counter(
            PREFIX + "prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            LABELS + ["source"],
            registry=self.registry,
        )
        self.prompt_tokens_by_source = {s: by_source.labels(*labels, s) for s in PROMPT_SOURCES}
        llm_engine = engine.engine
        self._shape = ModelShape.of(
            llm_engine.model_args,
            llm_engine.dtype.itemsize,
            llm_engine.config.tensor_parallel_size,
        )
        perf = [
            ("estimated_flops_per_gpu", "floating point operations"),
            ("estimated_read_bytes_per_gpu", "bytes read from memory"),
            ("estimated_write_bytes_per_gpu", "bytes written to memory"),
        ]
        self.flops, self.read_bytes, self.write_bytes = (
            Counter(
                PREFIX + name,
                f"Estimated number of {what} per GPU (for Model Flops Utilization calculations).",
                LABELS,
                registry=self.registry,
            ).labels(*labels)
            for name, what in perf
        )
        self._engine_stats = llm_engine.stats  # read on the engine thread only (record)
        self._external_hits_seen = self._engine_stats.external_prefix_cache_hits
        self.registry.register(_EngineStateCollector(engine, model_name))
        self.registry.register(_CacheConfigCollector(engine))
        self._remove_observer = engine.add_stats_observer(self.record)

    def record(self, stats: IterationStats) -> None:
        """Runs on the engine thread (prometheus_client's metrics are thread-safe)."""
        for ttft in stats.time_to_first_tokens:
            self.ttft.observe(ttft)
        for itl in stats.inter_token_latencies:
            self.itl.observe(itl)
        if stats.batch:
            perf = self._shape.step(stats.batch)
            self.flops.inc(perf.flops)
            self.read_bytes.inc(perf.read_bytes)
            self.write_bytes.inc(perf.write_bytes)
        external_hits = self._engine_stats.external_prefix_cache_hits
        self._count_prompt_sources(stats.admitted, external_hits - self._external_hits_seen)
        self._external_hits_seen = external_hits
        num_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        if num_tokens:
            self.iteration_tokens.observe(num_tokens)
        for finished in stats.finished_requests:
            self.e2e.observe(finished.e2e_latency)
            self.queue.observe(finished.queued_time)
            self.prefill.observe(finished.prefill_time)
            self.decode.observe(finished.decode_time)
            self.inference.observe(finished.inference_time)
            self.tpot.observe(finished.mean_time_per_output_token)
            self.num_preemptions.observe(finished.num_preemptions)
            self.prefill_kv_computed.observe(
                finished.num_prompt_tokens - finished.num_cached_tokens
            )
            self.prompt_tokens.observe(finished.num_prompt_tokens)
            self.generation_tokens.observe(finished.num_generation_tokens)
            if finished.max_tokens is not None:
                self.params_max_tokens.observe(finished.max_tokens)
        # Once per request, not per completion, as vLLM observes its parent request.
        for n, most in zip(stats.n_params, stats.max_num_generation_tokens, strict=True):
            self.params_n.observe(n)
            self.max_generation_tokens.observe(most)

    def _count_prompt_sources(self, admitted: list[tuple[int, int]], external: int) -> None:
        """The prompts of the requests first scheduled in this step, by where their tokens came
        from. A request's cached tokens are the prefix cache's and the KV connector's together
        (`Request.num_cached_tokens`); the connector's part is `external`, the scheduler's
        count of connector tokens since the last call, given to these requests in order. (A
        preempted request re-admitted with connector tokens in the same step as a new one would
        lend it those: the scheduler counts per step, not per request.)"""
        for num_prompt, num_cached in admitted:
            from_connector = min(external, num_cached)
            external -= from_connector
            self.prompt_tokens_cached.inc(num_cached)
            self.prompt_tokens_by_source["local_compute"].inc(num_prompt - num_cached)
            self.prompt_tokens_by_source["local_cache_hit"].inc(num_cached - from_connector)
            self.prompt_tokens_by_source["external_kv_transfer"].inc(from_connector)

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
        self._labels = [model_name, ENGINE]
        # A counter's `_created` series (its start, as prometheus_client's own counters and
        # vLLM's /metrics have it): when this app began to serve the engine's figures.
        self._created = time.time()
        connector = engine.engine.kv_source
        self._has_connector = connector.config is not None  # (the NullConnector has none)
        name = type(connector).__name__
        self._connector_source = CONNECTOR_SOURCE.get(name, "external_unspecified")

    def _family(
        self, kind: type, prefix: str, name: str, doc: str, by: str, values: dict[str, float]
    ) -> Metric:
        """One family with a label `by` beyond vLLM's two, one sample per value of it."""
        metric = kind(prefix + name, doc, labels=[*LABELS, by])
        created = {"created": self._created} if kind is CounterMetricFamily else {}
        for value_of_by, value in values.items():
            metric.add_metric([*self._labels, value_of_by], value, **created)
        return metric

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats

        def gauge(name: str, doc: str, value: float, prefix: str = PREFIX) -> GaugeMetricFamily:
            metric = GaugeMetricFamily(prefix + name, doc, labels=LABELS)
            metric.add_metric(self._labels, value)
            return metric

        def counter(name: str, doc: str, value: float, prefix: str = PREFIX) -> Metric:
            metric = CounterMetricFamily(prefix + name, doc, labels=LABELS)
            # Exposed as name + "_total", and name + "_created".
            metric.add_metric(self._labels, value, created=self._created)
            return metric

        yield gauge(
            "num_requests_running",
            "Number of requests in model execution batches.",
            stats.num_running,
        )
        yield gauge(
            "num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting
        )
        # Every waiting request waits for capacity (a free seat, blocks or token budget): the
        # scheduler defers none for a transient reason (LoRA, an async KV load), as vLLM can.
        yield self._family(
            GaugeMetricFamily,
            PREFIX,
            "num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (none here).",
            "reason",
            {"capacity": stats.num_waiting, "deferred": 0},
        )
        yield self._family(
            GaugeMetricFamily,
            PREFIX,
            "engine_sleep_state",
            "Engine sleep state; nanovllm has no sleep mode: always awake.",
            "sleep_state",
            {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
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
        # The connector is asked, at every admission, for the tokens past the local hit.
        external_queries = stats.prefix_cache_queries - stats.prefix_cache_hits
        yield counter(
            "external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
            external_queries if self._has_connector else 0,
        )
        yield counter(
            "external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
            stats.external_prefix_cache_hits,
        )
        by_source = dict.fromkeys(CACHE_HIT_SOURCES, 0)
        by_source["device"] = stats.prefix_cache_hits
        by_source[self._connector_source] += stats.external_prefix_cache_hits
        yield self._family(
            CounterMetricFamily,
            PREFIX,
            "prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device, host, disk, "
            "p2p or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits "
            "+ vllm:external_prefix_cache_hits.",
            "source",
            by_source,
        )
        yield self._family(
            CounterMetricFamily,
            PREFIX,
            "request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            {**dict.fromkeys(FINISHED_REASONS, 0), **stats.finished},
        )
        if stats.num_speculative_tokens:
            yield from self._spec_decode(stats, counter)
        yield gauge("kv_cache_used_blocks", "KV cache blocks in use.", stats.num_used_blocks, OURS)
        yield gauge("kv_cache_total_blocks", "KV cache blocks in all.", stats.num_kv_blocks, OURS)
        yield gauge(
            "kv_cache_cached_free_blocks",
            "Free KV cache blocks that still hold a cached prefix.",
            stats.num_cached_free_blocks,
            OURS,
        )
        yield gauge(
            "generation_tokens_per_second",
            "Generated tokens per second over the last 10 seconds.",
            stats.tokens_per_second(),
            OURS,
        )
        yield counter("engine_steps", "Engine steps run.", stats.num_steps, OURS)
        yield counter("engine_errors", "Engine steps that raised.", stats.num_engine_errors, OURS)
        yield gauge(
            "event_subscribers", "Listeners on /v1/events.", stats.num_event_subscribers, OURS
        )

    def _spec_decode(self, stats: ServerStats, counter: Callable[..., Metric]) -> Iterator[Metric]:
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
        per_pos = stats.spec_decode_num_accepted_tokens_per_pos
        yield self._family(
            CounterMetricFamily,
            PREFIX,
            "spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose proposed token at this position was accepted.",
            "position",
            {str(position): count for position, count in enumerate(per_pos)},
        )


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


class ToolParserInvocations:
    """vLLM's `vllm:tool_call_parser_invocations_total` (vllm/parser/metrics.py, vLLM 0.32):
    registered when the server has a tool-call parser, its 12 label sets at 0 from the start;
    counted each time the parser reads "auto" tool calls: once per choice of a whole response,
    once per delta of a stream (a delta is the tokens a choice gained since the last one sent,
    so its count depends on how many steps each chunk merged, on vLLM's server too). `outcome`
    is "tool_call" when that reading found calls (a delta: sent some). Its labels are vLLM's:
    `model_name` and no `engine` (the API server counts it, not an engine)."""

    MODES = ("streaming", "non_streaming")
    OUTCOMES = ("tool_call", "no_tool_call")
    REQUEST_TYPES = ("chat_completions", "responses", "other")  # nanovllm has only the first

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        counter = Counter(
            PREFIX + "tool_call_parser_invocations",
            "Total number of ToolParser invocations. Non-streaming increments once per choice; "
            "streaming increments once per delta.",
            ["model_name", "mode", "outcome", "request_type"],
            registry=registry,
        )
        self._series = {
            (mode, outcome, kind): counter.labels(model_name, mode, outcome, kind)
            for mode in self.MODES
            for outcome in self.OUTCOMES
            for kind in self.REQUEST_TYPES
        }

    def record(self, tool_called: bool, streaming: bool) -> None:
        """One reading of a chat choice's output by the parser."""
        mode = "streaming" if streaming else "non_streaming"
        outcome = "tool_call" if tool_called else "no_tool_call"
        self._series[mode, outcome, "chat_completions"].inc()
