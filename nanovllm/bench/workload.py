"""Benchmark workloads: the requests every engine is given, identical for all of them.

A workload is a list of requests, each a prompt (token ids), how many output tokens it asks for
(EOS is ignored everywhere, so it gets exactly that many) and when it arrives (0 for offline
runs). Three shapes:

- `random_workload`: N requests with prompt and output lengths drawn uniformly from ranges, the
  shape of nano-vllm's own bench;
- `shared_prefix_workload`: the same, behind one common prefix (a system prompt), to measure
  prefix caching;
- `with_poisson_arrivals`: any workload given arrival times at a mean rate, for online latency.

Lengths and token ids come from two separately seeded generators. The lengths therefore depend
only on the seed and the ranges, never on the vocabulary, so a 4k-vocabulary model and a
32k-vocabulary model are asked for exactly the same numbers of tokens.

A workload round-trips through JSON, which is how it reaches vLLM in its own process.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace

# Separate streams from one user seed: changing how ids are drawn never moves the lengths.
_LENGTH_STREAM = 0x1E46
_OUTPUT_LENGTH_STREAM = 0x0E46
_PREFIX_STREAM = 0x9FE1
_TOKEN_STREAM = 0x70C3
_ARRIVAL_STREAM = 0xA221
_SAMPLING_STREAM = 0x5EED

# Low ids are often special tokens (BOS, EOS, padding); prompts avoid them.
FIRST_PROMPT_ID = 3


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int  # output tokens asked for; with EOS ignored, exactly what is generated
    arrival_s: float = 0.0  # seconds after the run starts
    seed: int | None = None  # the request's own sampling seed (sampled workloads)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[BenchRequest]
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    shared_prefix_len: int = 0
    description: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def max_seq_len(self) -> int:
        return max(r.num_prompt_tokens + r.max_tokens for r in self.requests)

    @property
    def online(self) -> bool:
        return any(r.arrival_s > 0 for r in self.requests)

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt, output) lengths: what must be equal across models and engines."""
        return [(r.num_prompt_tokens, r.max_tokens) for r in self.requests]

    def head(self, n: int, output_scale: float = 1.0) -> Workload:
        """The first `n` requests, outputs scaled (for warm-ups and calibration passes)."""
        reqs = [
            replace(r, max_tokens=max(1, round(r.max_tokens * output_scale)), arrival_s=0.0)
            for r in self.requests[:n]
        ]
        return replace(self, name=f"{self.name}[:{n}]", requests=reqs)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        data = dict(data)
        data["requests"] = [BenchRequest(**r) for r in data["requests"]]
        return cls(**data)


def parse_range(text: str | int | tuple[int, int]) -> tuple[int, int]:
    """ "32:256" -> (32, 256); "64" -> (64, 64). Both ends inclusive, lo <= hi, lo >= 1."""
    if isinstance(text, tuple):
        lo, hi = text
    elif isinstance(text, int):
        lo = hi = text
    else:
        parts = str(text).split(":")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"a length range is N or LO:HI (integers), got {text!r}")
        lo, hi = int(parts[0]), int(parts[-1])
    if lo < 1 or hi < lo:
        raise ValueError(f"a length range needs 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _rng(seed: int, stream: int) -> random.Random:
    return random.Random(seed * 0x1_0000 + stream)


def _draw_lengths(rng: random.Random, n: int, r: tuple[int, int]) -> list[int]:
    return [rng.randint(r[0], r[1]) for _ in range(n)]


def _draw_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_PROMPT_ID, vocab_size) for _ in range(n)]


def _sampling_seeds(seed: int, n: int, temperature: float) -> list[int | None]:
    if temperature == 0.0:
        return [None] * n
    rng = _rng(seed, _SAMPLING_STREAM)
    return [rng.randrange(2**31) for _ in range(n)]


def random_workload(
    num_requests: int,
    prompt_len: tuple[int, int] | int,
    output_len: tuple[int, int] | int,
    vocab_size: int,
    seed: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> Workload:
    """N requests, prompt and output lengths uniform in their (inclusive) ranges."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    prompt_len, output_len = parse_range(prompt_len), parse_range(output_len)
    # Prompt and output lengths from their own streams: request i's lengths do not depend on how
    # many requests there are after it (a smaller run is a prefix of a larger one).
    prompts = _draw_lengths(_rng(seed, _LENGTH_STREAM), num_requests, prompt_len)
    outputs = _draw_lengths(_rng(seed, _OUTPUT_LENGTH_STREAM), num_requests, output_len)
    ids = _rng(seed, _TOKEN_STREAM)
    seeds = _sampling_seeds(seed, num_requests, temperature)
    requests = [
        BenchRequest(_draw_ids(ids, p, vocab_size), o, seed=s)
        for p, o, s in zip(prompts, outputs, seeds)
    ]
    return Workload(
        name="random",
        requests=requests,
        temperature=temperature,
        top_p=top_p,
        description=(
            f"{num_requests} requests, prompts {prompt_len[0]}-{prompt_len[1]}, "
            f"outputs {output_len[0]}-{output_len[1]} tokens"
        ),
        meta={"seed": seed, "prompt_len": list(prompt_len), "output_len": list(output_len)},
    )


def shared_prefix_workload(
    num_requests: int,
    prefix_len: int,
    suffix_len: tuple[int, int] | int,
    output_len: tuple[int, int] | int,
    vocab_size: int,
    seed: int = 0,
    temperature: float = 0.0,
) -> Workload:
    """N requests that all start with the same `prefix_len` tokens (think: a system prompt)."""
    suffix_len, output_len = parse_range(suffix_len), parse_range(output_len)
    base = random_workload(num_requests, suffix_len, output_len, vocab_size, seed, temperature)
    prefix = _draw_ids(_rng(seed, _PREFIX_STREAM), prefix_len, vocab_size)
    requests = [replace(r, prompt_token_ids=prefix + r.prompt_token_ids) for r in base.requests]
    return replace(
        base,
        name="shared-prefix",
        requests=requests,
        shared_prefix_len=prefix_len,
        description=(
            f"{num_requests} requests, a {prefix_len}-token shared prefix + "
            f"{suffix_len[0]}-{suffix_len[1]} own tokens, outputs {output_len[0]}-{output_len[1]}"
        ),
    )


def with_poisson_arrivals(workload: Workload, rate: float, seed: int = 0) -> Workload:
    """Arrival times of a Poisson process at `rate` requests/s (the first arrives at 0)."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    rng = _rng(seed, _ARRIVAL_STREAM)
    t, requests = 0.0, []
    for i, r in enumerate(workload.requests):
        if i > 0:
            t += rng.expovariate(rate)
        requests.append(replace(r, arrival_s=t))
    return replace(
        workload,
        name=f"{workload.name}@{rate:g}/s",
        requests=requests,
        description=f"{workload.description}, Poisson arrivals at {rate:g} req/s",
        meta={**workload.meta, "request_rate": rate},
    )
