"""What the engine hands back: vLLM-shaped `RequestOutput`s.

`RequestOutput` is one request's state as the caller sees it: its prompt, and in
`.outputs[0]` (a `CompletionOutput`) the text and token ids generated so far, with a
`finish_reason` once it is done. The shape is vLLM's, so `out.outputs[0].text` works in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    # What this completion gained since the previous output of its request (nanovllm's
    # addition: with n > 1 each completion streams on its own).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    # With `prompt_logprobs`: per prompt token, its entry (None for the first), as in vLLM.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # New text since the previous output of this request (what a stream prints next).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # Why the request finished with finish_reason "error" (a nanovllm addition to vLLM's shape).
    error: str | None = None
