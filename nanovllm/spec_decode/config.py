"""`speculative_config`: how the engine speculates, in vLLM's shape, checked once.

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5})

- `method`: "ngram" (prompt lookup: `ngram_proposer.py`).
- `num_speculative_tokens` (k): at most this many proposed tokens per request and step.
- `prompt_lookup_min` / `prompt_lookup_max`: the n-gram sizes tried, longest first. As in vLLM,
  when neither is given both are 5, and when one is given the other takes its value.

A bad value is a ValueError that names it.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram",)
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {config!r}")
        unknown = sorted(set(config) - set(KEYS))
        if "model" in unknown:
            raise ValueError(
                f"speculative_config: a draft model ({config['model']!r}) is not supported; "
                "use method 'ngram'"
            )
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown} (known: {list(KEYS)})")
        method = config.get("method", "ngram")
        if method not in METHODS:
            raise ValueError(
                f"speculative_config: unknown method {method!r} (supported: {list(METHODS)})"
            )
        k = config.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(
                f"speculative_config: num_speculative_tokens must be an int >= 1, got {k!r}"
            )
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if low is None and high is None:
            low = high = 5
        low = high if low is None else low
        high = low if high is None else high
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"speculative_config: {name} must be an int >= 1, got {value!r}")
        if low > high:
            raise ValueError(
                f"speculative_config: prompt_lookup_min={low} exceeds prompt_lookup_max={high}"
            )
        return cls(method, k, low, high)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
