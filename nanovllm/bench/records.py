"""What one timed engine run returns: per request, the tokens it got and when each arrived.

Every engine plug-in, in this process or in vLLM's, reduces its run to this one shape, so
throughput, latency and agreement are computed by the same code for all of them. Times are
seconds since the run's start (the moment the first request could be submitted), taken with
`time.perf_counter` in the process that ran the engine. An engine may generate more tokens
than a request asked for (a static batch runs until its longest member is done); plug-ins keep
only the first `max_tokens` tokens and their times.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestRecord:
    token_ids: list[int]
    token_times: list[float]  # seconds since run start, one per output token
    arrival_s: float = 0.0

    @property
    def ttft(self) -> float | None:
        """Time to first token, from the request's arrival."""
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class EngineRun:
    engine: str
    wall_s: float  # from run start until the last request's last token
    records: list[RequestRecord]
    extra: dict = field(default_factory=dict)  # engine-specific (nanovllm's per-step records)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.records)

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EngineRun:
        return cls(**{**data, "records": [RequestRecord(**r) for r in data["records"]]})
