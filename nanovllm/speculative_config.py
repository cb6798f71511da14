"""`speculative_config`: how the engine speculates, in vLLM's shape, checked once.

    LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    LLM(model, speculative_config={"model": "path/to/small-model", "num_speculative_tokens": 4})

- `method`: "ngram" (prompt lookup: `spec_decode/ngram_proposer.py`) or "draft_model" (a smaller model with
  the same vocabulary proposes: `spec_decode/draft_model_proposer.py`). As in vLLM, giving `model` without a
  method means "draft_model", and giving neither means "ngram".
- `num_speculative_tokens` (k): at most this many proposed tokens per request and step.
- `prompt_lookup_min` / `prompt_lookup_max` (ngram only): the n-gram sizes tried, longest first.
  As in vLLM, when neither is given both are 5, and when one is given the other takes its value.
- `model` (draft_model only): the draft checkpoint's folder.

A bad value is a ValueError that names it.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")
NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    model: str | None = None  # the draft model's folder (method "draft_model")

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past its next token that a request must hold for the proposer to write.

        A draft model computes its own KV for the token it proposes from and for each proposal
        but the last (k slots); the n-gram proposer reads no model and needs none.
        """
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {config!r}")
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown} (known: {list(KEYS)})")
        model = config.get("model")
        method = config.get("method", "draft_model" if model is not None else "ngram")
        if method not in METHODS:
            raise ValueError(
                f"speculative_config: unknown method {method!r} (supported: {list(METHODS)})"
            )
        k = config.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(
                f"speculative_config: num_speculative_tokens must be an int >= 1, got {k!r}"
            )
        if method == "draft_model":
            if not isinstance(model, str) or not model:
                raise ValueError(
                    "speculative_config: method 'draft_model' needs 'model', the draft "
                    f"checkpoint's folder, got {model!r}"
                )
            ngram_keys = [key for key in NGRAM_KEYS if key in config]
            if ngram_keys:
                raise ValueError(
                    f"speculative_config: {ngram_keys} apply to method 'ngram' only, not "
                    "'draft_model'"
                )
            return cls(method, k, model=model)
        if model is not None:
            raise ValueError(
                f"speculative_config: 'model' ({model!r}) is for method 'draft_model', not "
                f"{method!r}"
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
