"""SamplingParams: how one request turns logits into tokens, and when it stops.

The names and meanings are vLLM's, so code written against nanovllm carries over:

- `temperature` 0 means greedy (argmax); otherwise logits are divided by it before sampling. As
  in vLLM, a temperature below 1e-5 (`SAMPLING_EPS`) also means greedy: dividing by a tiny
  temperature overflows the logits to infinity, and softmax of infinities is NaN.
- `min_p` drops tokens less likely than `min_p` times the most likely one; then `top_k` keeps
  the tokens whose logit is at least the k-th largest (-1 or 0: all; tokens tied with the k-th
  are kept), and `top_p` the smallest set of most likely tokens whose probability reaches p.
  This is vLLM's order and meaning (see `executor/sampler.py`).
- `seed` gives the request its own random generator, so its draws do not depend on what else
  happens to share the batch.
- `n` completions of the same prompt (parallel sampling; `engine/parallel_sampling.py`).
- `max_tokens` caps the output; `stop` strings end it (and are never streamed out, not even
  partially); `stop_token_ids` and, unless `ignore_eos`, the model's EOS token end it too.
- `logprobs`: for each generated token, the log-probabilities of the `logprobs` most likely
  tokens (plus the sampled one).
- Logits processing, before temperature (vLLM v1's order, `executor/logits_processors.py`):
  `allowed_token_ids` masks every other token; `bad_words` (strings) bans the last token of a
  bad word where the output so far ends with the ones before it; `min_tokens` bans the stop
  tokens (EOS unless `ignore_eos`, and `stop_token_ids`) until that many tokens are out, and
  stop strings are not looked for until then; `logit_bias` (token id -> bias, clamped to
  [-100, 100]) is added to the logits; `repetition_penalty` (> 0; 1 = off) divides a positive
  logit, and multiplies a negative one, of every token in the prompt or the output;
  `frequency_penalty` and `presence_penalty` (in [-2, 2]; 0 = off) subtract `count x
  frequency_penalty + (count > 0) x presence_penalty`, counting the output tokens only. Greedy
  requests get them too: the argmax is taken after them.
- `logprobs=-1` asks for the whole vocabulary; logprobs are those of the raw distribution, and
  with them `cumulative_logprob` (their sum over the sampled tokens), each entry's `rank`
  (1-based) and `decoded_token`.
- `prompt_logprobs`: for every prompt token after the first, its logprob given the tokens before
  it, plus the top `prompt_logprobs` (-1: all); such a request reads nothing from the prefix
  cache (as in vLLM), so every prompt token is computed.
- `truncate_prompt_tokens` is not a sampling parameter (vLLM 0.32's `SamplingParams` has no
  such field, so code written for it does not pass one): giving it is a TypeError, as vLLM's
  unexpected keyword is, naming the value and where it goes instead, `LLM.generate(...,
  tokenization_kwargs={"truncate_prompt_tokens": k})` (or the server's request field).
  `truncate_prompt` and `encode_truncated` below cut.
- `detokenize=False` skips turning tokens into text: outputs carry token ids and empty text
  (stop strings need the text, so they are refused then).
- `output_kind` (a `RequestOutputKind`) says what each step's output holds: `CUMULATIVE` (the
  default) the completion so far, `DELTA` only what this step added, `FINAL_ONLY` nothing until
  the request finishes (what `LLM.generate` asks for: it only keeps the last output).
- `structured_outputs` (a `StructuredOutputsParams`): the output must be a JSON value of a
  schema, match a regex, be one of a list of strings, or follow a grammar
  (`nanovllm/structured_output/`).

Every value is checked when the object is built: a bad value is a `ValueError` that names it,
before the request ever reaches the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# Below this temperature a request is sampled greedily (vLLM's `_SAMPLING_EPS`).
SAMPLING_EPS = 1e-5


class RequestOutputKind(IntEnum):
    """What a request's outputs hold, step by step (vLLM's enum of the same name)."""

    CUMULATIVE = 0  # every output holds the whole completion so far
    DELTA = 1  # every output holds only the tokens (and text) new since the previous one
    FINAL_ONLY = 2  # one output, when the request finishes, holding the whole completion


@dataclass
class StructuredOutputsParams:
    """Which language a request's output must belong to (vLLM's class of this name).

    Exactly one constraint: `json` (a JSON Schema, a dict or its text: the output is a JSON
    value that validates), `regex` (the output matches it as a whole), `choice` (the output is
    one of these strings), `grammar` (an EBNF grammar, rule `root`) or `json_object=True` (any
    JSON object, OpenAI's `{"type": "json_object"}`). `disable_any_whitespace`: JSON without
    free whitespace between its tokens (by default any is allowed, as in vLLM).

    Only the shape is checked here; whether the constraint compiles is found out at
    `add_request` (`nanovllm/structured_output/`), a `ValueError` naming it when not.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("json", "regex", "choice", "grammar", "json_object")
            if getattr(self, name) not in (None, False)
        ]
        if not given:
            raise ValueError(
                "structured_outputs needs one constraint (json, regex, choice, grammar or "
                "json_object), but none was given"
            )
        if len(given) > 1:
            raise ValueError(
                f"structured_outputs takes one constraint, but {len(given)} were given: "
                f"{', '.join(given)}"
            )
        if self.json is not None and not isinstance(self.json, str | dict):
            raise ValueError(f"structured_outputs.json must be a dict or a str, got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"structured_outputs.{name} must be a non-empty str, got {value!r}"
                )
        choice = self.choice
        if choice is not None and (
            not isinstance(choice, list | tuple)
            or not choice
            or not all(isinstance(c, str) and c for c in choice)
        ):
            raise ValueError(
                f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                f"got {choice!r}"
            )
        if self.json_object not in (None, True, False):
            raise ValueError(
                f"structured_outputs.json_object must be a bool, got {self.json_object!r}"
            )
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(
                "structured_outputs.disable_any_whitespace must be a bool, "
                f"got {self.disable_any_whitespace!r}"
            )

    @property
    def key(self) -> tuple[str, str]:
        """(kind, spec as text): what a compiled grammar is cached by."""
        if self.json is not None:
            spec = (
                self.json if isinstance(self.json, str) else json.dumps(self.json, sort_keys=True)
            )
            kind = "json"
        elif self.regex is not None:
            kind, spec = "regex", self.regex
        elif self.choice is not None:
            kind, spec = "choice", json.dumps(list(self.choice))
        elif self.grammar is not None:
            kind, spec = "grammar", self.grammar
        else:
            kind, spec = "json_object", ""
        if kind in ("json", "json_object") and self.disable_any_whitespace:
            kind += "/compact"
        return kind, spec


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None  # refused (see the module docstring)
    # vLLM's free-form extras, e.g. {"kv_transfer_params": {...}} for disaggregated prefill
    # (`kv_transfer/p2p.py`). The engine passes them through untouched.
    extra_args: dict[str, Any] | None = None
    _stop: tuple[str, ...] = field(init=False, repr=False, default=())
    uses_logits_processors: bool = field(init=False, repr=False, default=False)
    _bad_words_token_ids: list[list[int]] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(
                f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {self.top_k!r}"
            )
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an int in [0, 2**63) or None, got {self.seed!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < -1):
                raise ValueError(f"{name} must be an int >= 0, -1 (all) or None, got {value!r}")
        k = self.truncate_prompt_tokens
        if k is not None:
            raise TypeError(
                f"truncate_prompt_tokens={k!r} is not a SamplingParams field (as in vLLM 0.32): "
                f'pass LLM.generate(..., tokenization_kwargs={{"truncate_prompt_tokens": {k!r}}})'
            )
        stop = self.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(s == "" for s in stop):
            raise ValueError(f"stop strings must not be empty, got {self.stop!r}")
        self._stop = tuple(stop)
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize must be True or False, got {self.detokenize!r}")
        if stop and not self.detokenize:
            raise ValueError(
                f"stop strings need the text: stop={self.stop!r} is not allowed with "
                "detokenize=False"
            )
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(
                f"output_kind must be a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY), "
                f"got {self.output_kind!r}"
            )
        ids = self.stop_token_ids or []
        if not isinstance(ids, list | tuple) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(
                f"stop_token_ids must be a list of ints >= 0, got {self.stop_token_ids!r}"
            )
        self.stop_token_ids = list(ids)
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise ValueError(
                f"structured_outputs must be a StructuredOutputsParams or None, got {so!r}"
            )
        self._check_logits_processing()

    def _check_logits_processing(self) -> None:
        """The fields of `executor/logits_processors.py` (vLLM's ranges). Token ids are checked
        against the vocabulary later, by the engine (`input_processor.py`)."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be a number > 0, got {self.repetition_penalty!r}"
            )
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens!r} must be <= max_tokens={self.max_tokens!r}"
            )
        bias = self.logit_bias or {}
        if not isinstance(bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}")
        clamped = {}
        for token, value in bias.items():
            token_id = token_id_key(token)
            if token_id is None:
                raise ValueError(
                    f"logit_bias key {token!r} is not a token id (an int >= 0, or its decimal "
                    "digits as OpenAI's clients send it)"
                )
            if not _is_number(value):
                raise ValueError(f"logit_bias[{token!r}] must be a finite number, got {value!r}")
            clamped[token_id] = min(100.0, max(-100.0, float(value)))
        self.logit_bias = clamped or None
        allowed = self.allowed_token_ids
        if allowed is not None and (
            not isinstance(allowed, list | tuple)
            or not allowed
            or not all(_is_int(t) and t >= 0 for t in allowed)
        ):
            raise ValueError(
                f"allowed_token_ids must be a non-empty list of ints >= 0, got {allowed!r}"
            )
        words = self.bad_words
        if words is not None and (
            not isinstance(words, list | tuple) or not all(isinstance(w, str) and w for w in words)
        ):
            raise ValueError(f"bad_words must be a list of non-empty strings, got {words!r}")
        self.bad_words = list(dict.fromkeys(words)) if words else None
        # Whether the sampler has anything to do before temperature (checked every step).
        self.uses_logits_processors = bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.min_tokens
            or self.logit_bias
            or self.allowed_token_ids is not None
            or self.bad_words
        )

    def update_from_tokenizer(self, tokenizer) -> None:
        """Tokenize `bad_words` as vLLM does: each word alone, and with one leading space when
        that gives a different first token and as many tokens (a word inside a sentence)."""
        self._bad_words_token_ids = []
        for word in self.bad_words or ():
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if not plain:
                raise ValueError(f"bad_words entry {word!r} tokenizes to no tokens")
            self._bad_words_token_ids.append(plain)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                self._bad_words_token_ids.append(spaced)

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        """The token sequences `bad_words` bans (set by the engine, `update_from_tokenizer`)."""
        return self._bad_words_token_ids

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self._stop

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def truncate_prompt(
    prompt: tuple[str | None, list[int]], k: int | None, max_model_len: int
) -> tuple[str | None, list[int]]:
    """(text, token ids) of a prompt cut to its last `k` tokens (vLLM's
    `truncate_prompt_tokens`; -1: max_model_len - 1, vLLM's "as many as fit"; None: uncut). A
    cut prompt has no text: the text of its first tokens is no longer what the tokens say."""
    text, token_ids = prompt
    if k is None:
        return text, token_ids
    k = _tokens_kept(k, max_model_len)
    if k >= len(token_ids):
        return text, token_ids
    return None, token_ids[len(token_ids) - k :]


def encode_truncated(tokenizer: Any, text: str, k: int, max_model_len: int) -> list[int]:
    """The token ids of a text prompt cut to its last `k` (-1: max_model_len - 1) by the
    tokenizer, as vLLM has its tokenizer cut one: from the left, keeping the special tokens it
    adds (a BOS stays first, and counts in the k)."""
    max_length = _tokens_kept(k, max_model_len)
    tokenizer.truncation_side = "left"  # vLLM's for a generating model (nanovllm cuts only here)
    return list(tokenizer.encode(text, truncation=True, max_length=max_length))


def _tokens_kept(k: Any, max_model_len: int) -> int:
    """How many tokens `truncate_prompt_tokens=k` keeps; a ValueError naming a bad k."""
    if not _is_int(k) or k < -1 or k == 0:
        raise ValueError(f"truncate_prompt_tokens must be an int >= 1, -1 or None, got {k!r}")
    if k > max_model_len:
        raise ValueError(
            f"truncate_prompt_tokens={k} cannot be greater than max_model_len={max_model_len}"
        )
    return max_model_len - 1 if k == -1 else k


def token_id_key(key: object) -> int | None:
    """A `logit_bias` key as a token id: an int >= 0, or the canonical decimal string of one
    ("5"; OpenAI's clients send the ids as JSON object keys). None for anything else: Python's
    `int()` would also read "05", " 5", "5_0" and "٥" (an Arabic-Indic five), so that several
    keys could name one token."""
    if isinstance(key, str):
        if not (key == "0" or (key[:1] in "123456789" and key.isascii() and key.isdigit())):
            return None
        return int(key)
    return key if _is_int(key) and key >= 0 else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
