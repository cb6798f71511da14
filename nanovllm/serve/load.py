"""An online load generator: N concurrent streaming clients against an OpenAI-compatible URL.

This is the measuring half of `nanovllm bench --serve URL`, and works against any server that
speaks OpenAI's streaming API (nanovllm, vLLM, ...), so the figures compare like for like:

    from nanovllm.serve.load import run_load_sync
    report = run_load_sync("http://127.0.0.1:8000", prompts, concurrency=16, max_tokens=128)
    print(report.format())

Closed loop: `concurrency` clients each send one streaming request, wait for its last token,
and send the next, until `num_requests` are done. For each request it records, from the moment
the request is sent:

- TTFT, time to first token: the first chunk that carries text (what a user waits for);
- ITL, inter-token latency: the gaps between the chunks that carry text (a server may pack
  several tokens in one chunk when a client falls behind; this is what the reader sees);
- TPOT, time per output token: (latency - TTFT) / (tokens - 1), independent of chunking;
- the output token count, from the server's `usage` (`stream_options.include_usage`).

Throughput is output tokens (and requests) over the wall time of the whole run. Latencies are
reported as mean, p50, p90, p99 and max, in seconds. Failed requests are counted and their first
errors kept, never raised: a load test should survive the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class RequestResult:
    ok: bool
    latency: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass
class Percentiles:
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    count: int = 0

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        ordered = sorted(values)
        return cls(
            mean=sum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            max=ordered[-1],
            count=len(ordered),
        )


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of sorted values, interpolating linearly (numpy's default)."""
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class LoadReport:
    url: str
    model: str
    concurrency: int
    num_requests: int
    num_ok: int
    num_errors: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    request_throughput: float  # finished requests per second
    output_throughput: float  # generated tokens per second, all clients together
    ttft: Percentiles
    itl: Percentiles
    tpot: Percentiles
    latency: Percentiles
    errors: list[str] = field(default_factory=list)  # the first few

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        def ms(p: Percentiles) -> str:
            return (
                f"mean {p.mean * 1e3:8.1f}  p50 {p.p50 * 1e3:8.1f}  p90 {p.p90 * 1e3:8.1f}  "
                f"p99 {p.p99 * 1e3:8.1f}  max {p.max * 1e3:8.1f} ms"
            )

        lines = [
            f"{self.url}  model {self.model}  concurrency {self.concurrency}",
            f"requests   {self.num_ok} ok, {self.num_errors} failed in {self.duration_s:.2f} s "
            f"({self.request_throughput:.2f} req/s)",
            f"tokens     {self.output_tokens} out, {self.prompt_tokens} in "
            f"({self.output_throughput:.1f} output tok/s)",
            f"TTFT       {ms(self.ttft)}",
            f"ITL        {ms(self.itl)}",
            f"TPOT       {ms(self.tpot)}",
            f"latency    {ms(self.latency)}",
        ]
        lines += [f"error      {e}" for e in self.errors]
        return "\n".join(lines)


async def _one_request(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], chat: bool
) -> RequestResult:
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and ": keep-alive" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message", chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                for choice in chunk.get("choices") or []:
                    text = (
                        (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    )
                    if text:
                        now = time.perf_counter()
                        if result.ttft is None:
                            result.ttft = now - start
                        else:
                            result.itl.append(now - last)
                        last = now
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.ok = True
    return result


async def _model_name(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run_load(
    url: str,
    prompts: Sequence[str | list[int]],
    *,
    concurrency: int = 16,
    num_requests: int | None = None,
    max_tokens: int = 128,
    model: str | None = None,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    chat: bool = False,
    extra_body: dict[str, Any] | None = None,
    timeout: float = 600.0,
    api_key: str | None = None,
) -> LoadReport:
    """Run the load and measure it (see the module docstring).

    `prompts` are used in turn (request i gets prompts[i % len(prompts)]); with `chat`, each is
    sent as one user message to /v1/chat/completions. `ignore_eos` (a vLLM extension that
    nanovllm and vLLM both accept) makes every request generate exactly `max_tokens`, so runs
    compare. `extra_body` is merged into every request body.
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    total = len(prompts) if num_requests is None else num_requests
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), timeout=timeout, limits=limits, headers=headers
    ) as client:
        model = model or await _model_name(client)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        next_index = 0
        results: list[RequestResult] = []

        def body_for(i: int) -> dict[str, Any]:
            prompt = prompts[i % len(prompts)]
            body: dict[str, Any] = {
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "ignore_eos": ignore_eos,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            return {**body, **(extra_body or {})}

        async def worker() -> None:
            nonlocal next_index
            while next_index < total:
                i = next_index
                next_index += 1  # no await in between: asyncio makes this atomic
                results.append(await _one_request(client, path, body_for(i), chat))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
        duration = time.perf_counter() - start

    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    return LoadReport(
        url=url,
        model=model,
        concurrency=concurrency,
        num_requests=total,
        num_ok=len(ok),
        num_errors=len(results) - len(ok),
        duration_s=duration,
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens=output_tokens,
        request_throughput=len(ok) / duration if duration > 0 else 0.0,
        output_throughput=output_tokens / duration if duration > 0 else 0.0,
        ttft=Percentiles.of([r.ttft for r in ok if r.ttft is not None]),
        itl=Percentiles.of([gap for r in ok for gap in r.itl]),
        tpot=Percentiles.of([t for r in ok if (t := r.tpot) is not None]),
        latency=Percentiles.of([r.latency for r in ok]),
        errors=[r.error for r in results if r.error][:5],
    )


def run_load_sync(url: str, prompts: Sequence[str | list[int]], **kwargs: Any) -> LoadReport:
    """`run_load` for synchronous callers (it runs its own event loop)."""
    return asyncio.run(run_load(url, prompts, **kwargs))
