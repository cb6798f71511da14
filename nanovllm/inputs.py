"""The prompt types of the offline API, as vLLM spells them (`vllm.inputs`).

A prompt is one of:

    "ROMEO:"                                   text, tokenized by the model's tokenizer
    [5, 17, 42]                                token ids, used as they are
    TextPrompt(prompt="ROMEO:")                {"prompt": "ROMEO:"}
    TokensPrompt(prompt_token_ids=[5, 17, 42]) {"prompt_token_ids": [5, 17, 42]}

The dicts are plain `TypedDict`s, so a script written for vLLM, which builds them either way,
runs here unchanged. A dict with any other key (vLLM's `multi_modal_data`, ...) is refused by
name rather than silently ignored: this engine is text-only.
"""

from __future__ import annotations

from typing import TypedDict


class TextPrompt(TypedDict):
    prompt: str


class _TokensPromptRequired(TypedDict):
    prompt_token_ids: list[int]


class TokensPrompt(_TokensPromptRequired, total=False):
    prompt: str  # the text the ids came from, echoed back in `RequestOutput.prompt`


PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids"})


def check_prompt_dict(prompt: dict) -> None:
    """A `ValueError` naming the first key the engine does not understand, if any."""
    unknown = sorted(str(key) for key in prompt if key not in PROMPT_KEYS)
    if unknown:
        raise ValueError(
            f"prompt dict key {unknown[0]!r} is not supported: nanovllm takes "
            "{'prompt': text} (TextPrompt) or {'prompt_token_ids': [...]} (TokensPrompt)"
        )
    if not PROMPT_KEYS & prompt.keys():
        raise ValueError("prompt dict needs 'prompt' (TextPrompt) or 'prompt_token_ids'")
