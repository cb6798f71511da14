"""Chat messages -> one prompt, through the tokenizer's chat template (as vLLM's chat_utils).

A chat model was trained on conversations laid out in one exact text format, with its own
special tokens between the turns. The model's tokenizer carries that format as a Jinja
template (`tokenizer.chat_template`); rendering the messages through it gives the prompt:

    [{"role": "user", "content": "Hi"}]  --template-->  "<|user|>Hi<|end|><|assistant|>"
                                          --encode---->  [token ids]

The rendered text already holds the template's special tokens (BOS ...), so it is encoded
with `add_special_tokens=False`: adding them again would put a second BOS in the prompt.

Transformers renders templates in Jinja's sandbox, and a message's content is data passed to
the template, never parsed as a template itself, so "{{ ... }}" in a message is just text.

A tokenizer without a template (the embedded Shakespeare model's, most base models') cannot
do chat: `resolve_chat_template` raises a `ValueError` naming the model and how to give one.
Both `LLM.chat` and the server's /v1/chat/completions go through this file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nanovllm.inputs import TokensPrompt


def resolve_chat_template(tokenizer: Any, chat_template: str | None, model: str, fix: str) -> str:
    """`chat_template` if given, else the tokenizer's own; `fix` says how to give one."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"model {model!r} has no chat template in its tokenizer, so chat messages cannot "
            f"be turned into a prompt: {fix}"
        )
    if not isinstance(template, str):  # a dict of named templates: use the default one
        template = dict(template).get("default")
        if not template:
            raise ValueError(f"model {model!r} has named chat templates but none is 'default'")
    return template


def message_text(content: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of parts of which only text is accepted."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, Sequence):
        raise ValueError(f"{where}: content must be a string or a list of parts")
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}]: only text parts are supported, got type {kind!r}")
        pieces.append(part["text"])
    return "".join(pieces)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages with text content; the other keys are left to the template."""
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"messages[{i}] must be a dict with a 'role', got {message!r}")
        copy = dict(message)
        copy["content"] = message_text(message.get("content"), f"messages[{i}].content")
        out.append(copy)
    return out


def render_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], chat_template: str, **options: Any
) -> TokensPrompt:
    """The conversation as a prompt: its text (`render_chat_text`, with the same keyword
    options) and its token ids (special tokens not re-added)."""
    text = render_chat_text(tokenizer, messages, chat_template, **options)
    return TokensPrompt(
        prompt=text, prompt_token_ids=tokenizer.encode(text, add_special_tokens=False)
    )


def render_chat_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    chat_template: str,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The conversation's prompt text (`render_chat` without the tokenizing: the server measures
    the text before it tokenizes it)."""
    if add_generation_prompt and continue_final_message:
        raise ValueError(
            "continue_final_message and add_generation_prompt cannot both be true: "
            "continue the last message, or start the assistant's reply"
        )
    try:
        return tokenizer.apply_chat_template(
            normalize_messages(messages),
            chat_template=chat_template,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **(chat_template_kwargs or {}),
        )
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a template may raise anything on a conversation
        raise ValueError(f"the chat template cannot render these messages: {exc}") from exc
