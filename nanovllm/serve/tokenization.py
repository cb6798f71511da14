"""vLLM's tokenizer routes: `POST /tokenize`, `POST /detokenize` and `GET /version`.

Clients count a prompt's tokens before they send it (to fit the context, or to bill), and
read a model's token ids back as text, through these routes of `vllm serve`; their bodies are
vLLM 0.32's (`vllm/entrypoints/serve/tokenize/protocol.py`):

    POST /tokenize   {"prompt": "Hello", "add_special_tokens": true, "return_token_strs": false}
                  or {"messages": [...], "add_generation_prompt": true, "tools": [...]}
                  -> {"count": 2, "max_model_len": 512, "tokens": [1, 15043], "token_strs": null}
    POST /detokenize {"tokens": [1, 15043]} -> {"prompt": "<s> Hello"}
    GET  /version    -> {"version": "..."}

A chat is rendered by the server's chat template exactly as `/v1/chat/completions` renders it
(`OpenAIServing.render_chat`), so `count` is the prompt a chat request with the same messages
would send the engine. Text is measured and tokenized as a generation request's is: on the
tokenizer thread, after the `--max-prompt-chars` check.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nanovllm.serve.errors import APIError
from nanovllm.serve.protocol import (
    ChatMessage,
    Neutral,
    TokenId,
    _check_utf8,
    _Strict,
)
from nanovllm.serve.serving import OpenAIServing
from nanovllm.serve.tools import Tool


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # a text prompt gets the tokenizer's BOS, as generation's
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    # The chat template writes the special tokens; the tokenizer adds none unless asked.
    add_special_tokens: bool = False
    continue_final_message: Neutral(False, "not supported") = None
    # Refused, as in chat requests (serve/README.md, "Safety").
    chat_template: None = Field(default=None, description="not accepted: the server's only")
    chat_template_kwargs: None = Field(default=None, description="not accepted")
    tools: list[Tool] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[TokenId]


def _check_prompt(prompt: str) -> str:
    _check_utf8(prompt)
    return prompt


class ServingTokenization:
    """The routes' handlers, on the generation endpoints' tokenizer and chat template."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def tokenize(
        self, body: TokenizeCompletionRequest | TokenizeChatRequest
    ) -> dict[str, Any]:
        serving = self.serving
        serving.check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            messages = [m.template_message(i) for i, m in enumerate(body.messages)]
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            _, tokens = await serving.render_chat(
                messages, body.add_generation_prompt, tools, body.add_special_tokens
            )
        else:
            tokens = await serving.encode(_check_prompt(body.prompt), body.add_special_tokens)
        token_strs = None
        if body.return_token_strs:
            token_strs = serving.tokenizer.convert_ids_to_tokens(tokens)
        return {
            "count": len(tokens),
            "max_model_len": serving.max_model_len,
            "tokens": tokens,
            "token_strs": token_strs,
        }

    async def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:
        serving = self.serving
        serving.check_model(body.model)
        vocab = serving.engine.engine.model_args.vocab_size
        outside = [t for t in body.tokens if t >= vocab]
        if outside:
            raise APIError(
                f"tokens: token id(s) {outside[:5]} are outside the vocabulary [0, {vocab})",
                param="tokens",
            )
        return {"prompt": serving.tokenizer.decode(body.tokens)}
