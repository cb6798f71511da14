"""The OpenAI request bodies, as pydantic models, and how they map onto `SamplingParams`.

FastAPI validates every body against these models and publishes them as the OpenAPI schema,
so the schema a client (or schemathesis) reads is the one the server enforces. Bounds that the
engine needs are declared here, where they show up in the schema:

- `seed` is at most 2**53 - 1 (JSON's safe integers), `top_k` fits a 32-bit int, `logprobs`
  is at most 20 (the sampler takes a top-k of that size from the vocabulary);
- unknown fields are ignored, as vLLM does, each named in a warning in the server's log ("The
  following fields were present in the request but ignored: ..."): a client written for another
  server (or a newer OpenAI SDK) keeps working. vLLM's own fields that change the answer in a way
  this engine cannot give (`use_beam_search`, `prompt_embeds`, `priority`, `add_special_tokens`,
  `return_token_ids`, ...) are declared here, accepted at their neutral value only and refused
  with a 400 naming them otherwise, so that no such request is silently answered differently;
- `n` (completions per prompt, parallel sampling) is at most `MAX_N`: each one is a request in
  the engine, and one HTTP request must not be able to fill it;
- types are strict: `max_tokens: true` or `"1"` is a 400, not 1 (pydantic's default would
  coerce both; so does vLLM's server, whose models are not strict). JSON Schema says the same:
  a boolean or a string is not an integer;
- `logit_bias` keys are token ids written as strings (JSON object keys), as OpenAI sends them,
  and only canonically: "5", never "05", " 5" or "٥", which `int()` would all read as 5. A
  refusal names the first few bad keys and how many there are, never all of them;
- OpenAI fields the engine does not implement (`best_of`, `suffix`) are accepted at their
  neutral value and refused with a 400 otherwise.

The extensions are vLLM's: `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`,
`skip_special_tokens`, `include_stop_str_in_output`, `repetition_penalty`, `min_tokens`,
`bad_words`, `allowed_token_ids`, `prompt_logprobs` (answered in the response, as vLLM does:
in each completion choice, or beside the chat choices; not with `stream`), `structured_outputs`
(with OpenAI's `response_format`, `response_format.py`).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    field_validator,
    model_validator,
)

from nanovllm.engine.logits_checks import some
from nanovllm.sampling_params import (
    SAMPLING_EPS,
    SamplingParams,
    StructuredOutputsParams,
    token_id_key,
)
from nanovllm.serve.errors import APIError, param_from_message
from nanovllm.serve.response_format import (
    ResponseFormat,
    StructuredOutputs,
    structured_outputs_params,
)
from nanovllm.serve.tools import (
    NamedToolChoice,
    Tool,
    ToolChoice,
    named_function,
    required_calls_schema,
)

logger = logging.getLogger("nanovllm.serve")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
# The largest seed: JSON's largest safe integer (2**53 - 1), which every client reads exactly,
# also those that hold JSON numbers as doubles (JavaScript's, a schema-driven fuzzer's): near
# 2**63, the engine's own bound, a double cannot tell neighbouring seeds apart.
MAX_SEED = 2**53 - 1
MAX_LOGPROBS = 20
MAX_N = 16  # completions per request (parallel sampling)
# Prompts in one batched completion request, and its completions (prompts x n) at most: each
# one is a request in the engine, and one HTTP request must not be able to fill it.
MAX_PROMPTS = 256


def _check_utf8(value: object) -> object:
    """Refuse lone surrogates ("\\ud800" in JSON): they are not text, and tokenizers choke."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("must be valid Unicode text (no lone surrogates)") from exc
    elif isinstance(value, list):
        for item in value:
            _check_utf8(item)
    return value


# A token id as a JSON object key (`logit_bias`): its decimal digits, no sign, no leading zero.
TOKEN_ID_KEY_PATTERN = "^(0|[1-9][0-9]*)$"


def _json_integer(value: object) -> object:
    """JSON Schema's integer: a number with no fractional part (1.0 is one), never a boolean or
    a string (pydantic's lax mode reads `true` and `"1"` as 1; its strict mode refuses 1.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def Int(**bounds: int) -> Any:  # noqa: N802 - used as a type
    """An integer field's type, with its bounds (`ge`, `le`): strict, but a float with no
    fraction is taken (JSON Schema's integer). The bounds sit before the coercion, where
    pydantic writes them into the JSON schema as `minimum` and `maximum`."""
    return Annotated[int, Field(**bounds), BeforeValidator(_json_integer)]


NonEmptyStr = Annotated[str, Field(min_length=1)]
# Python's whitespace (`str.isspace`), written out: JSON Schema's `\s` (ECMAScript's) differs.
_PY_SPACE = "\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A bad word is tokenized without its leading whitespace (as vLLM does): whitespace alone would
# ban nothing, so a word must hold one other character. The schema states it as a pattern; the
# check is Python's own, with a message that names the word.


def _not_all_space(word: str) -> str:
    if word.isspace():
        raise ValueError(
            f"{word!r} is whitespace only: a bad word must hold a character other than whitespace"
        )
    return word


BadWord = Annotated[
    str,
    Field(
        min_length=1,
        description="a word with at least one character that is not whitespace",
        json_schema_extra={"pattern": f"[^{_PY_SPACE}]"},
    ),
    AfterValidator(_not_all_space),
]
TokenId = Int(ge=0)  # (the app's schema adds the vocabulary's bound: openapi.py)


class _Strict(BaseModel):
    """Strict types; unknown fields ignored, as vLLM does, and named in a warning."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _warn_of_ignored_fields(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        result = handler(data)
        if isinstance(data, dict):
            ignored = data.keys() - cls.model_fields.keys()
            if ignored:
                logger.warning(
                    "The following fields were present in the request but ignored: %s",
                    sorted(ignored),
                )
        return result


class StreamOptions(_Strict):
    include_usage: bool = False


def _same_type(value: Any) -> Any:
    """A check that a field's value has `value`'s type exactly: Literal[False] alone takes 0
    (Python's 0 == False), which JSON Schema's `false` does not, and Literal[0] takes `false`."""

    def check(given: Any) -> Any:
        if type(value) is int:
            given = _json_integer(given)  # (JSON Schema's 0 is 0.0 too)
        if given is not None and type(given) is not type(value):
            raise ValueError(f"must be {value!r} (a {type(value).__name__}), got {given!r}")
        return given

    return check


def Neutral(value: Any, why: str) -> Any:  # noqa: N802 - used as a type
    """A vLLM field nanovllm does not implement: its neutral `value` (or null) only, so the
    schema says so and any other value is a 400 naming the field."""
    return Annotated[
        Literal[value] | None,
        Field(description=f"only {value!r}: {why}"),
        BeforeValidator(_same_type(value)),
    ]


def _not_both(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema for "not field a with value a[...] together with field b with b[...]"."""
    return {"not": {"required": [*a, *b], "properties": {**a, **b}}}


# Cross-field rules JSON Schema can state, in each request's schema (as the checks that refuse
# them do: `to_sampling_params`, `engine_prompt`, `_logprobs`, `structured_outputs_params`).
_STRUCTURED_ONCE = _not_both(
    {"response_format": {"type": "object", "properties": {"type": {"not": {"const": "text"}}}}},
    {"structured_outputs": {"type": "object"}},
)
# n > 1 needs sampling: n greedy completions would be one completion n times (vLLM's rule).
_NO_GREEDY_N = _not_both(
    {"n": {"type": "integer", "minimum": 2}},
    {"temperature": {"type": "number", "exclusiveMaximum": SAMPLING_EPS}},
)
_NO_PROMPT_LOGPROBS_STREAM = _not_both(
    {"prompt_logprobs": {"type": "integer"}}, {"stream": {"const": True}}
)


class _GenerationRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: Int(ge=1) | None = Field(
        default=None,
        description="with the prompt's tokens, at most max_model_len (a rule JSON Schema "
        "cannot state)",
    )
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int(ge=-1, le=INT32_MAX) | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: Int(ge=0, le=MAX_SEED) | None = None
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    n: Int(ge=1, le=MAX_N) = 1
    # vLLM's: what a disaggregated proxy tells each engine (`kv_transfer/p2p.py`).
    kv_transfer_params: dict[str, Any] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    logit_bias: dict[str, float] | None = Field(
        default=None,
        json_schema_extra={
            "propertyNames": {"pattern": TOKEN_ID_KEY_PATTERN},
            "description": "token id (decimal digits, as a string) -> bias, clamped to "
            "[-100, 100]; every id must be in the model's vocabulary",
        },
    )
    min_tokens: Int(ge=0) = Field(
        default=0, description="at most max_tokens (a rule JSON Schema cannot state)"
    )
    bad_words: list[BadWord] | None = None
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    prompt_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None  # structured outputs (`response_format.py`)
    structured_outputs: StructuredOutputs | None = None
    # vLLM's: keep only the prompt's last k tokens (-1: as many as fit, max_model_len - 1).
    truncate_prompt_tokens: Int(ge=-1, le=INT64_MAX) | None = None
    # vLLM's fields this engine does not implement, accepted at their neutral value only.
    use_beam_search: Neutral(False, "no beam search") = None
    priority: Neutral(0, "first come, first served scheduling") = None
    prompt_embeds: None = Field(default=None, description="not supported")
    return_token_ids: Neutral(False, "not supported") = None
    return_tokens_as_token_ids: Neutral(False, "not supported") = None
    truncation_side: Neutral("left", "truncate_prompt_tokens keeps the last tokens") = None
    watermarking: Neutral(False, "not supported") = None
    return_token_offsets: Neutral(False, "not supported") = None
    logprob_token_ids: None = Field(default=None, description="not supported")
    repetition_detection: None = Field(default=None, description="not supported")
    thinking_token_budget: None = Field(default=None, description="not supported")

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keeps_a_token(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be -1 (as many as fit) or >= 1: 0 would leave no prompt")
        return value

    @field_validator("stop", "bad_words")
    @classmethod
    def _stop_is_text(cls, value: object) -> object:
        return _check_utf8(value)

    @field_validator("logit_bias")
    @classmethod
    def _canonical_token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        bad = [key for key in value or {} if token_id_key(key) is None]
        if bad:
            raise ValueError(
                f'keys must be token ids written as decimal digits ("5", not "05" or '
                f'" 5"); {len(bad):,} are not: {some(bad)}'
            )
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def _logprobs(self) -> int | None:
        return None

    def _prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def to_sampling_params(self) -> SamplingParams:
        """The engine's view of this request; a 400 naming the field when a value is refused."""
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(
                "prompt_logprobs is not supported with stream=true",
                param="prompt_logprobs",
                code="unsupported_parameter",
            )
        values = dict(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            seed=self.seed,
            max_tokens=self._max_tokens(),
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            logprobs=self._logprobs(),
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=structured_outputs_params(
                self.response_format, self.structured_outputs
            ),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self.logit_bias,
            min_tokens=self.min_tokens,
            bad_words=self.bad_words,
            allowed_token_ids=self.allowed_token_ids,
            prompt_logprobs=self._prompt_logprobs(),
            extra_args=(
                {"kv_transfer_params": self.kv_transfer_params}
                if self.kv_transfer_params is not None
                else None
            ),
        )
        try:
            params = SamplingParams(**values)
        except ValueError as exc:
            raise APIError(str(exc), param=param_from_message(str(exc), set(values))) from exc
        if params.n > 1 and params.greedy:
            raise APIError(f"n must be 1 when using greedy sampling, got {params.n}.", param="n")
        return params


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions. A prompt (text or token ids) or a batch of them."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _STRUCTURED_ONCE,
                _NO_PROMPT_LOGPROBS_STREAM,
                _NO_GREEDY_N,
            ]
        }
    )

    # A prompt (text or token ids), or a batch of them (OpenAI's list form): each prompt of a
    # batch is a request of its own in the engine, answered as `n` choices of the response.
    prompt: (
        NonEmptyStr
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_PROMPTS),
        ]
    )
    max_tokens: Int(ge=1) | None = 16  # OpenAI's default for completions
    logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    echo: bool = False
    suffix: str | None = Field(default=None, max_length=0, description="not supported")
    best_of: Int(ge=1, le=1) | None = Field(default=None, description="only 1 is supported")

    @field_validator("prompt")
    @classmethod
    def _prompt_is_text(cls, value: object) -> object:
        return _check_utf8(value)

    # vLLM's: the prompt's special tokens (BOS) added when it is tokenized (text prompts).
    add_special_tokens: Neutral(True, "the tokenizer's special tokens are always added") = None

    def _logprobs(self) -> int | None:
        return self.logprobs

    def _prompt_logprobs(self) -> int | None:
        # `echo` with `logprobs` answers the prompt's logprobs too (as vLLM does): the engine
        # computes them as prompt_logprobs, at least `logprobs` of them.
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs

    def engine_prompts(self) -> list[str | list[int]]:
        """The request's prompts, one for each engine request (a batch of one when `prompt`
        is a single text or list of token ids)."""
        prompt = self.prompt
        is_batch = isinstance(prompt, list) and isinstance(prompt[0], str | list)
        batch = prompt if is_batch else [prompt]
        if self.suffix:
            raise APIError("suffix is not supported", param="suffix", code="unsupported_parameter")
        if self.best_of not in (None, 1):
            raise APIError(
                "best_of > 1 is not supported", param="best_of", code="unsupported_parameter"
            )
        if len(batch) * self.n > MAX_PROMPTS:
            raise APIError(
                f"prompt: {len(batch)} prompts x n={self.n} is {len(batch) * self.n} "
                f"completions; this server answers at most {MAX_PROMPTS} in one request",
                param="prompt",
            )
        return batch


class ContentPart(BaseModel):
    # Any part parses; only text parts are taken (`ChatMessage.text`), as the schema says.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
            "required": ["type", "text"],
        },
    )
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    # Messages may carry fields we do not use: dropped, not refused.
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # An assistant's earlier calls, and a tool message's answer to one (given to the template).
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content", "name")
    @classmethod
    def _utf8(cls, value: object) -> object:
        if isinstance(value, list):
            for part in value:
                _check_utf8(part.text)
            return value
        return _check_utf8(value)

    def text(self, index: int) -> str:
        """The message's text; image or audio parts are a 400 (this is a text-only engine)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        pieces = []
        for j, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise APIError(
                    f"messages[{index}].content[{j}]: only text parts are supported, "
                    f"got type {part.type!r}",
                    param=f"messages.{index}.content.{j}",
                    code="unsupported_parameter",
                )
            pieces.append(part.text)
        return "".join(pieces)

    def template_message(self, index: int) -> dict[str, Any]:
        """The message as the chat template reads it: its text, and its tool calls with their
        arguments as objects (as vLLM gives them to templates, which index into them)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text(index)}
        if self.name:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            calls = []
            for call in self.tool_calls:
                call = dict(call)
                function = dict(call.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except ValueError:
                        pass  # not JSON: the template gets the text
                call["function"] = function
                calls.append(call)
            message["tool_calls"] = calls
        return message


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _STRUCTURED_ONCE,
                _NO_PROMPT_LOGPROBS_STREAM,
                _NO_GREEDY_N,
                {  # top_logprobs needs logprobs: true
                    "anyOf": [
                        {"not": {"required": ["top_logprobs"]}},
                        {"properties": {"top_logprobs": {"type": "null"}}},
                        {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
                    ]
                },
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int(ge=1) | None = None
    logprobs: bool = False
    top_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    add_generation_prompt: bool = True
    # vLLM's: the chat template writes the special tokens; the tokenizer adds none.
    add_special_tokens: Neutral(False, "the chat template writes the special tokens") = None
    echo: Neutral(False, "not supported in chat") = None
    continue_final_message: Neutral(False, "not supported") = None
    # Refused, not ignored (vLLM takes them): a template or its arguments from a client would be
    # rendered by the server (serve/README.md, "Safety"), and this engine makes no tool calls.
    chat_template: None = Field(default=None, description="not accepted: the server's only")
    chat_template_kwargs: None = Field(default=None, description="not accepted")
    documents: None = Field(default=None, description="not accepted")
    # Tool calling (`tools.py`): the tools go into the chat template; `tool_choice` as OpenAI's
    # (None: "auto" when tools are given, else "none", as vLLM reads it).
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template reads them."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def _tool_constraint(self) -> StructuredOutputsParams | None:
        """`required` and a named function constrain the output (`tools.py`); a 400 when
        tool_choice names no tool of `tools`, or comes without them."""
        choice = self.effective_tool_choice
        if choice != "none" and not self.tools:
            raise APIError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if choice in ("none", "auto"):
            return None
        if self.response_format is not None or self.structured_outputs is not None:
            raise APIError(
                "tool_choice 'required' or a named tool constrains the output: it cannot be "
                "combined with response_format or structured_outputs",
                param="tool_choice",
            )
        if choice == "required":
            return StructuredOutputsParams(json=required_calls_schema(self.tools))
        try:
            tool = named_function(self.tools, choice.function.name)
        except ValueError as exc:
            raise APIError(str(exc), param="tool_choice") from exc
        return StructuredOutputsParams(
            json=tool.function.parameters or {"type": "object", "properties": {}}
        )

    def _max_tokens(self) -> int | None:
        # OpenAI's newer name wins; None lets the engine fill the context.
        return self.max_completion_tokens or self.max_tokens

    def to_sampling_params(self) -> SamplingParams:
        params = super().to_sampling_params()
        constraint = self._tool_constraint()
        if constraint is not None:
            params.structured_outputs = constraint
        if self.tools and self.effective_tool_choice != "none":
            # vLLM's hermes parser reads the tags as text, special tokens or not.
            params.skip_special_tokens = False
        return params

    def _logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.template_message(i) for i, m in enumerate(self.messages)]
