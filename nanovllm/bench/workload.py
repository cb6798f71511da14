"""The requests every engine is given: identical token ids, lengths and arrival times for all.

A request is a prompt (token ids), how many output tokens it asks for (EOS is ignored by every
engine, so it gets exactly that many) and when it arrives (0 for offline runs). Three shapes:

- `random_workload`: prompt and output lengths uniform in their ranges, as in nano-vllm's bench;
- `shared_prefix_workload`: the same behind one common prefix (a system prompt), for prefix
  caching;
- `with_poisson_arrivals`: any workload with arrival times at a mean rate, for online latency.

Lengths, token ids, arrivals and sampling seeds come from separately seeded generators, so the
lengths depend only on the seed and the ranges: a 4k-vocabulary and a 32k-vocabulary model are
asked for exactly the same numbers of tokens, and request i's lengths do not depend on how many
requests follow it. A workload round-trips through JSON, which is how it reaches vLLM's process.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

# One stream per quantity: changing how ids are drawn never moves the lengths.
_PROMPT_LENGTHS, _OUTPUT_LENGTHS, _TOKENS, _PREFIX, _ARRIVALS, _SEEDS = range(6)

FIRST_PROMPT_ID = 3  # low ids are often special tokens (BOS, EOS, padding); prompts avoid them


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int  # output tokens asked for; with EOS ignored, exactly what is generated
    arrival_s: float = 0.0  # seconds after the run starts
    seed: int | None = None  # the request's own sampling seed (sampled workloads only)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    requests: list[BenchRequest]
    description: str
    temperature: float = 0.0  # 0: greedy

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

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt, output) lengths: what is equal across models and engines."""
        return [(r.num_prompt_tokens, r.max_tokens) for r in self.requests]

    def head(self, n: int, output_scale: float = 1.0) -> Workload:
        """The first `n` requests, all at t=0, outputs scaled (warm-ups, calibration)."""
        reqs = [
            replace(r, max_tokens=max(1, round(r.max_tokens * output_scale)), arrival_s=0.0)
            for r in self.requests[:n]
        ]
        return replace(self, requests=reqs, description=f"first {n} of: {self.description}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        return cls(**{**data, "requests": [BenchRequest(**r) for r in data["requests"]]})


def parse_range(text: str) -> tuple[int, int]:
    """ "32:256" -> (32, 256); "64" -> (64, 64). Both ends inclusive, 1 <= lo <= hi."""
    parts = str(text).split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"a length range is N or LO:HI (integers), got {text!r}")
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < 1 or hi < lo:
        raise ValueError(f"a length range needs 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _rng(seed: int, stream: int) -> random.Random:
    return random.Random(seed * 0x1_0000 + stream)


def _ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_PROMPT_ID, vocab_size) for _ in range(n)]


def random_workload(
    num_requests: int,
    prompt_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    temperature: float = 0.0,
) -> Workload:
    """N requests, prompt and output lengths uniform in their (inclusive) ranges."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    prompts = _rng(seed, _PROMPT_LENGTHS)
    outputs = _rng(seed, _OUTPUT_LENGTHS)
    ids, seeds = _rng(seed, _TOKENS), _rng(seed, _SEEDS)
    requests = [
        BenchRequest(
            _ids(ids, prompts.randint(*prompt_len), vocab_size),
            outputs.randint(*output_len),
            seed=seeds.randrange(2**31) if temperature > 0 else None,
        )
        for _ in range(num_requests)
    ]
    description = (
        f"{num_requests} requests, prompts {prompt_len[0]}-{prompt_len[1]}, "
        f"outputs {output_len[0]}-{output_len[1]} tokens"
    )
    return Workload(requests, description, temperature)


def shared_prefix_workload(
    num_requests: int,
    prefix_len: int,
    suffix_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    temperature: float = 0.0,
) -> Workload:
    """N requests that all start with the same `prefix_len` tokens (think: a system prompt)."""
    base = random_workload(num_requests, suffix_len, output_len, vocab_size, seed, temperature)
    prefix = _ids(_rng(seed, _PREFIX), prefix_len, vocab_size)
    requests = [replace(r, prompt_token_ids=prefix + r.prompt_token_ids) for r in base.requests]
    description = (
        f"{num_requests} requests, a {prefix_len}-token shared prefix + "
        f"{suffix_len[0]}-{suffix_len[1]} own tokens, outputs {output_len[0]}-{output_len[1]}"
    )
    return replace(base, requests=requests, description=description)


def with_poisson_arrivals(workload: Workload, rate: float, seed: int = 0) -> Workload:
    """Arrival times of a Poisson process at `rate` requests/s (the first arrives at 0)."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    rng = _rng(seed, _ARRIVALS)
    t, requests = 0.0, []
    for i, r in enumerate(workload.requests):
        t += rng.expovariate(rate) if i else 0.0
        requests.append(replace(r, arrival_s=t))
    description = f"{workload.description}, Poisson arrivals at {rate:g} req/s"
    return replace(workload, requests=requests, description=description)
