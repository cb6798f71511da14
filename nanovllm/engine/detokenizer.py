"""Incremental detokenization and stop strings: turning a growing list of tokens into text.

Decoding the whole output again after every token costs O(n) per token. Instead we keep two
offsets into the request's tokens (prompt, then output) and decode only a short window:

    tokens:  ... [prefix_offset ........ read_offset ........ end]
                  '--- already emitted ---''---- new tokens ----'

    new text = decode(window) minus decode(window up to read_offset)

The window starts a little before the new tokens because a token's text can depend on its
neighbours. A SentencePiece-style (Metaspace) tokenizer drops the leading space of the *first*
token it decodes, so "▁world" alone decodes to "world"; that is why the window starts inside
the prompt (its last 5 tokens, as in vLLM) rather than at the first output token: seen after
the prompt, "▁world" decodes to " world". And with a byte-level BPE a single character can span
several tokens (an "é" is two bytes): while the decoded window ends in U+FFFD, the replacement
for an incomplete UTF-8 sequence, we emit nothing and wait for the next token.

This two-offset scheme comes from Hugging Face's text-generation-inference, which vLLM adopted.

Stop strings: the output text is searched for every stop string; the text is cut before the
match and the request finishes. So that a stop string is never streamed out *partially*, the last
`len(longest stop string) - 1` characters are held back until more text shows they are not the
start of a stop string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# How many prompt tokens the first window reaches back (vLLM's
# INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
PROMPT_CONTEXT_TOKENS = 5


@dataclass
class DetokenizerState:
    text: str = ""  # the output text so far (after any stop-string cut)
    prefix_offset: int = 0
    read_offset: int = 0
    num_streamed_chars: int = 0  # how much of `text` has been handed to the caller
    stop_checked_upto: int = 0
    skip_special_tokens: bool = True  # the request's choice: EOS and friends stay out of the text

    @classmethod
    def after_prompt(
        cls, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> DetokenizerState:
        """The state for a request whose token list starts with these prompt tokens.

        The first window reaches `PROMPT_CONTEXT_TOKENS` back into the prompt, so the first
        output token is decoded in context (see the module docstring).
        """
        n = len(prompt_token_ids)
        return cls(
            prefix_offset=max(n - PROMPT_CONTEXT_TOKENS, 0),
            read_offset=n,
            skip_special_tokens=skip_special_tokens,
        )


# transformers' own decode of a fast tokenizer: to_py_obj, then the Rust tokenizer's decode, then
# an optional clean-up of spaces. Where that is all it does, the engine calls the Rust decode
# directly: two decodes per output token through transformers' wrapper took ~11% of a 64-request
# decode step on the embedded model (cProfile), the Rust decode itself about a seventh of that.
_PLAIN_FAST_DECODES = ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode")


def rust_decoder(tokenizer) -> Callable[[list[int], bool], str] | None:
    """`decode(ids, skip_special_tokens)` of the tokenizer's Rust backend, when calling it gives
    exactly what `tokenizer.decode` gives; else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    own_decode = getattr(type(tokenizer), "_decode", None)
    if (
        backend is None
        or getattr(own_decode, "__qualname__", None) not in _PLAIN_FAST_DECODES
        or getattr(tokenizer, "clean_up_tokenization_spaces", True)
    ):
        return None
    return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decode = rust_decoder(tokenizer) or (
            lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
        )

    def step(self, state: DetokenizerState, token_ids: list[int], final: bool = False) -> str:
        """Append the text of the newest token(s) to `state.text`; return what was added.

        `token_ids` is the list the state's offsets index: the prompt then the output for a state
        made by `DetokenizerState.after_prompt`, the output alone for a fresh `DetokenizerState()`.
        `final`: the request is over, so an incomplete character will never complete; flush it
        (as U+FFFD), making the text equal to a full decode of the output.
        """
        skip = state.skip_special_tokens
        prefix_text = self.decode(token_ids[state.prefix_offset : state.read_offset], skip)
        new_text = self.decode(token_ids[state.prefix_offset :], skip)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""  # an incomplete character (or a token with no text): wait
        delta = new_text[len(prefix_text) :]
        state.text += delta
        state.prefix_offset = state.read_offset
        state.read_offset = len(token_ids)
        return delta


def find_stop_string(
    state: DetokenizerState, stop: tuple[str, ...], include_in_output: bool
) -> str | None:
    """If the text now contains a stop string, cut the text there and return that string."""
    if not stop:
        return None
    longest = max(len(s) for s in stop)
    start = max(state.stop_checked_upto - longest + 1, 0)
    best: tuple[int, str] | None = None
    for s in stop:
        idx = state.text.find(s, start)
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, s)
    state.stop_checked_upto = len(state.text)
    if best is None:
        return None
    idx, s = best
    state.text = state.text[: idx + len(s)] if include_in_output else state.text[:idx]
    return s


def take_streamable(state: DetokenizerState, stop: tuple[str, ...], finished: bool) -> str:
    """The text that can be streamed now: all of it when finished, else all but a stop-length tail."""
    end = len(state.text)
    if not finished and stop:
        end = max(end - (max(len(s) for s in stop) - 1), state.num_streamed_chars)
    chunk = state.text[state.num_streamed_chars : end]
    state.num_streamed_chars = end
    return chunk
