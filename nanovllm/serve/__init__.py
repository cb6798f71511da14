"""nanovllm.serve: an OpenAI-compatible streaming server on the engine (`nanovllm serve`).

    async_engine.py  AsyncLLMEngine: one thread owns the engine, asyncio clients share it
    protocol.py      OpenAI request bodies (pydantic) -> SamplingParams
    serving.py       /v1/completions and /v1/chat/completions, streamed (SSE) or not
    api_server.py    the FastAPI app: routes for the above, /v1/models, /health, /metrics
    guard.py         the door: API key, request body size limit, concurrent request limit
    event_stream.py  /v1/events: the engine's events as SSE (for `nanovllm viz --connect`)
    stats.py         per-request latencies (TTFT, inter-token, queue, e2e) on the engine thread
    metrics.py       /metrics: prometheus_client, vLLM's metric names under `nanovllm:`
    errors.py        OpenAI-shaped 4xx/5xx errors
    sse.py           SSE framing, and aborting a generation when its client disconnects
    server.py        uvicorn in a thread (tests, notebooks) or in the foreground (the CLI)
    load.py          an online load generator: concurrent streaming clients, TTFT and ITL
    disagg_proxy.py  `--disagg-proxy`: one endpoint in front of a prefill and a decode server
    cli.py           `nanovllm serve`

Nothing here is imported by the engine: the server is one more client of `LLMEngine`.
"""
