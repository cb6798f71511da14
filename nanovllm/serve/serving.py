"""The generation endpoints: `/v1/completions` and `/v1/chat/completions`, streamed or not.

Each HTTP request becomes one engine request:

    body (pydantic) -> SamplingParams + prompt -> AsyncLLMEngine.add_request -> RequestStream
        stream=false: wait for the finished output -> one JSON response
        stream=true:  each output -> one SSE chunk (its completions' `delta_text`) ... -> [DONE]

With `n` > 1 the engine samples n completions of the prompt (parallel sampling): the response
has one choice per completion, `index` 0 .. n-1. A stream sends one choice per chunk, as vLLM
does: a client loop that reads `chunk.choices[0]` sees every completion's tokens, each chunk
saying by its `index` whose they are. A completion chunk carries `stop_reason` (null until the
chunk that finishes the choice: then the stop string or token id that ended it, as in vLLM);
a chat chunk carries it on the finishing chunk only (as vLLM's do).

`echo` puts the prompt before the first text of each choice (in a stream, in its first chunk);
with `logprobs`, the prompt's tokens come first in the logprobs too, the first one with a null
logprob (nothing comes before it), as vLLM answers: the engine computes them as prompt logprobs.
`truncate_prompt_tokens` keeps the prompt's last k tokens before any length check
(`sampling_params.truncate_prompt`), and echo then shows the text of those tokens.

The engine is asked first and the response starts only after it accepted the request, so a
refused request (prompt too long, bad stop string ...) is a proper 400, never a broken stream.
A `max_tokens` that does not fit the context beside the prompt is a 400 too, as in vLLM's
server (`context_length_check`), where the offline engine cuts it to the rest of the context
(as vLLM's does); without `max_tokens`, a chat generates up to the rest of the context.
Whatever way the response ends, the request is aborted if it is still running: a client that
disconnects frees its KV blocks before the next engine step. The non-streaming path watches
for the disconnect itself, since nothing is being written that would notice it.

When a slow client falls behind, the outputs already waiting are merged into one chunk, so it
catches up in one write instead of one per token.

Chat messages become a prompt through `nanovllm/chat_utils.py`, as in `LLM.chat`. Tokenizer use
on this side (chat templates, logprob token strings, echo) goes through the server's own
tokenizer instance: the engine's belongs to the engine thread.

No request's size can stall the others. Every prompt is measured here, in the handler, before
any heavy work: text longer than `max_prompt_chars` characters, or more token ids than
`max_model_len`, cannot fit the context and is a 400 naming its size at once. Text under the
limit is tokenized on a tokenizer thread (as vLLM's server does), never on the engine thread,
which only ever receives token ids: a step is never held up by someone else's tokenization.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from nanovllm.chat_utils import render_chat_text, resolve_chat_template
from nanovllm.engine.llm_engine import Prompt
from nanovllm.engine.outputs import CompletionOutput, Logprob, RequestOutput
from nanovllm.sampling_params import SamplingParams, truncate_prompt
from nanovllm.serve.async_engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineError,
    RequestStream,
    ServerShutdownError,
)
from nanovllm.serve.errors import APIError, error_body, param_from_message
from nanovllm.serve.protocol import ChatCompletionRequest, CompletionRequest
from nanovllm.serve.sse import DONE, ClosingStreamingResponse, sse_data


class OpenAIServing:
    def __init__(
        self,
        engine: AsyncLLMEngine,
        tokenizer: Any,
        model_name: str | list[str],
        chat_template: str | None = None,
        max_prompt_chars: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        # Requests may name any of the served names; responses name the first (vLLM's rule).
        self.model_names = [model_name] if isinstance(model_name, str) else list(model_name)
        self.model_name = self.model_names[0]
        self.chat_template = chat_template  # None: the tokenizer's own (chat_utils.py)
        self.max_model_len = engine.engine.max_model_len
        if max_prompt_chars is None:
            max_prompt_chars = self.max_model_len * max_chars_per_token(tokenizer)
        if max_prompt_chars < 1:
            raise ValueError(f"max_prompt_chars must be >= 1, got {max_prompt_chars}")
        self.max_prompt_chars = max_prompt_chars
        # One thread, as vLLM's server has: tokenizing releases the GIL, so it runs beside the
        # event loop and the engine thread; requests queue for it in arrival order.
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="nanovllm-tokenizer")

    def close(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    # --- /v1/completions ------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        params = body.to_sampling_params()
        prompt = body.engine_prompt()
        request_id = f"cmpl-{uuid.uuid4().hex}"
        stream, text, token_ids = await self._add(
            request_id, prompt, params, "prompt", "max_tokens"
        )
        echo = None
        if body.echo:
            echo = Echo(text if text is not None else self.tokenizer.decode(token_ids), token_ids)
        created = int(time.time())
        if body.stream:
            return ClosingStreamingResponse(
                self._completion_chunks(stream, body, created, echo), on_close=stream.abort
            )
        final = await self._collect(stream, raw)
        choices = []
        for out in final.outputs:
            logprobs = None
            out_ids, entries = list(out.token_ids), list(out.logprobs or [])
            if echo is not None:
                out_ids, entries = echo.before(out_ids, entries, final.prompt_logprobs)
            if params.logprobs is not None:
                logprobs, _ = self._completion_logprobs(out_ids, entries, params.logprobs, 0)
            choices.append(
                {
                    "index": out.index,
                    "text": (echo.text if echo is not None else "") + out.text,
                    "logprobs": logprobs,
                    "finish_reason": out.finish_reason,
                    "stop_reason": out.stop_reason,
                    "prompt_logprobs": _prompt_logprobs_json(final.prompt_logprobs),
                }
            )
        return JSONResponse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "usage": _usage(final),
            }
        )

    async def _completion_chunks(
        self, stream: RequestStream, body: CompletionRequest, created: int, echo: Echo | None
    ) -> AsyncIterator[str]:
        def chunk(choices: list[dict], usage: dict | None = None) -> str:
            return self._chunk("text_completion", stream.request_id, created, choices, usage)

        offsets = [0] * body.n  # where each choice's next logprob token starts in its text
        finished: set[int] = set()
        echoed: set[int] = set()
        try:
            async for output in stream:
                last, moved = _merge([output, *stream.drain_ready()])
                for out, text, token_ids in moved:
                    entries = out.logprobs[-len(token_ids) :] if token_ids and out.logprobs else []
                    if echo is not None and out.index not in echoed:
                        echoed.add(out.index)
                        text = echo.text + text
                        token_ids, entries = echo.before(token_ids, entries, last.prompt_logprobs)
                    logprobs = None
                    if body.logprobs is not None and token_ids:
                        logprobs, offsets[out.index] = self._completion_logprobs(
                            token_ids, entries, body.logprobs, offsets[out.index]
                        )
                    finish = _finish_once(out, finished)
                    if text or finish or logprobs:
                        stop = out.stop_reason if finish else None
                        yield chunk([_text_choice(out.index, text, logprobs, finish, stop)])
                if last.finished and body.include_usage:
                    yield chunk([], _usage(last))
        except EngineError as exc:
            yield sse_data(error_body(str(exc), "server_error", None, _engine_error_code(exc)))
        yield DONE

    # --- /v1/chat/completions -------------------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        params = body.to_sampling_params()
        prompt = await self._chat_prompt(body)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        max_tokens_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        stream, _, _ = await self._add(request_id, prompt, params, "messages", max_tokens_param)
        created = int(time.time())
        if body.stream:
            return ClosingStreamingResponse(
                self._chat_chunks(stream, body, created), on_close=stream.abort
            )
        final = await self._collect(stream, raw)
        choices = []
        for out in final.outputs:
            logprobs = None
            if params.logprobs is not None:
                logprobs = self._chat_logprobs(out.token_ids, out.logprobs, params.logprobs)
            choices.append(
                {
                    "index": out.index,
                    "message": {"role": "assistant", "content": out.text},
                    "logprobs": logprobs,
                    "finish_reason": out.finish_reason,
                    "stop_reason": out.stop_reason,
                }
            )
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "usage": _usage(final),
                "prompt_logprobs": _prompt_logprobs_json(final.prompt_logprobs),
            }
        )

    async def _chat_prompt(self, body: ChatCompletionRequest) -> dict[str, Any]:
        """The conversation's text and token ids, rendered and tokenized on the tokenizer
        thread (the text is measured first: `_check_chars`)."""
        try:
            template = resolve_chat_template(
                self.tokenizer,
                self.chat_template,
                self.model_name,
                fix="use /v1/completions, or start the server with --chat-template FILE",
            )
        except ValueError as exc:
            raise APIError(str(exc), param="messages", code="chat_template_missing") from exc

        def render() -> dict[str, Any]:  # on the tokenizer thread
            try:
                text = render_chat_text(
                    self.tokenizer,
                    body.template_messages(),
                    template,
                    add_generation_prompt=body.add_generation_prompt,
                )
            except ValueError as exc:
                raise APIError(f"messages: {exc}", param="messages") from exc
            self._check_chars(text, "messages")
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            return {"prompt": text, "prompt_token_ids": list(token_ids)}

        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, render)

    async def _chat_chunks(
        self, stream: RequestStream, body: ChatCompletionRequest, created: int
    ) -> AsyncIterator[str]:
        def chunk(choices: list[dict], usage: dict | None = None) -> str:
            return self._chunk("chat.completion.chunk", stream.request_id, created, choices, usage)

        def choice(index: int, delta: dict, logprobs: dict | None, finish: str | None) -> dict:
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

        top_n = (body.top_logprobs or 0) if body.logprobs else None
        finished: set[int] = set()
        try:
            role = {"role": "assistant", "content": ""}
            for i in range(body.n):
                yield chunk([choice(i, role, None, None)])
            async for output in stream:
                last, moved = _merge([output, *stream.drain_ready()])
                for out, text, token_ids in moved:
                    logprobs = None
                    if top_n is not None and token_ids:
                        entries = out.logprobs[-len(token_ids) :] if out.logprobs else []
                        logprobs = self._chat_logprobs(token_ids, entries, top_n)
                    finish = _finish_once(out, finished)
                    if text or finish or logprobs:
                        delta = {"content": text} if text else {}
                        moved_choice = choice(out.index, delta, logprobs, finish)
                        if finish:
                            moved_choice["stop_reason"] = out.stop_reason
                        yield chunk([moved_choice])
                if last.finished and body.include_usage:
                    yield chunk([], _usage(last))
        except EngineError as exc:
            yield sse_data(error_body(str(exc), "server_error", None, _engine_error_code(exc)))
        yield DONE

    # --- shared ---------------------------------------------------------------------------------

    def _chunk(
        self, kind: str, request_id: str, created: int, choices: list[dict], usage: dict | None
    ) -> str:
        """One SSE chunk; `usage` only on the last one (with `stream_options.include_usage`)."""
        payload: dict[str, Any] = {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": self.model_name,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return sse_data(payload)

    def check_model(self, model: str | None) -> None:
        if model and model not in self.model_names:
            served = ", ".join(f"`{name}`" for name in self.model_names)
            raise APIError(
                f"The model `{model}` does not exist (this server serves {served})",
                status_code=404,
                param="model",
                code="model_not_found",
            )

    async def _add(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        prompt_param: str,
        max_tokens_param: str,
    ) -> tuple[RequestStream, str | None, list[int]]:
        """The request's stream, with its prompt's text (None when unknown) and token ids, as
        the engine got them (after `truncate_prompt_tokens`)."""
        text, token_ids = await self._tokenize(prompt, prompt_param, params)
        check = context_length_check(params.max_tokens, self.max_model_len, max_tokens_param)
        if check is not None:
            check(len(token_ids))
        kv_params = (params.extra_args or {}).get("kv_transfer_params")
        connector = self.engine.engine.kv_source
        if kv_params and connector.config is not None:  # (the NullConnector: no connector)
            # Only the proxy names a transfer (it signs it with the KV secret): a client's
            # made-up one would hold its request, and a slot, for nothing (`kv_transfer/secret.py`).
            refusal = connector.check_kv_transfer_params(kv_params)
            if refusal is not None:
                raise APIError(
                    refusal,
                    status_code=403,
                    param="kv_transfer_params",
                    code="kv_transfer_params_forbidden",
                )
            # Disaggregated decode: the prompt's KV is on its way from a producer engine; the
            # request waits here, holding no KV block, until it arrived (or did not in time).
            await connector.await_remote_kv(kv_params)
        engine_prompt: dict[str, Any] = {"prompt_token_ids": token_ids}
        if text is not None:
            engine_prompt["prompt"] = text
        try:
            stream = await self.engine.add_request(request_id, engine_prompt, params)
        except EngineDeadError as exc:
            raise APIError(str(exc), status_code=503, code="engine_unavailable") from exc
        except ValueError as exc:
            message = str(exc)
            param = "max_tokens" if "max_tokens=" in message else prompt_param
            param = param_from_message(message, set(SamplingParams.__dataclass_fields__)) or param
            if message.startswith("structured_outputs"):  # a constraint that does not compile
                param = "response_format"
            raise APIError(message, param=param) from exc
        return stream, text, token_ids

    async def _tokenize(
        self, prompt: Prompt, param: str, params: SamplingParams
    ) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt, cut to `truncate_prompt_tokens`; a 400 naming its
        size, before any heavy work, when it cannot fit the context whatever its tokens. (A
        chat's prompt comes tokenized.)"""
        k = params.truncate_prompt_tokens
        if k is not None and k > self.max_model_len:
            raise APIError(
                f"truncate_prompt_tokens={k} cannot be greater than max_model_len="
                f"{self.max_model_len}",
                param="truncate_prompt_tokens",
            )
        if isinstance(prompt, str):
            self._check_chars(prompt, param)
            loop = asyncio.get_running_loop()
            token_ids = await loop.run_in_executor(
                self._tokenizer_thread, self.tokenizer.encode, prompt
            )
            if k is not None and 0 < (k if k > 0 else self.max_model_len - 1) < len(token_ids):
                # The tokenizer cuts it, as vLLM's server has it do: from the left, keeping the
                # special tokens it adds (a BOS stays first, and counts in the k).
                token_ids = await loop.run_in_executor(
                    self._tokenizer_thread, self._encode_truncated, prompt, k
                )
                return None, list(token_ids)
            return truncate_prompt((prompt, list(token_ids)), params, self.max_model_len)
        text = prompt.get("prompt") if isinstance(prompt, dict) else None
        token_ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
        text, token_ids = truncate_prompt((text, list(token_ids)), params, self.max_model_len)
        if len(token_ids) > self.max_model_len:
            raise APIError(
                f"prompt of {len(token_ids)} tokens does not fit max_model_len="
                f"{self.max_model_len} (refused before any other check)",
                param=param,
                code="context_length_exceeded",
            )
        return text, token_ids

    def _encode_truncated(self, text: str, k: int) -> list[int]:
        max_length = self.max_model_len - 1 if k == -1 else k
        self.tokenizer.truncation_side = "left"  # (vLLM's for generation; only used here)
        return self.tokenizer.encode(text, truncation=True, max_length=max_length)

    def _check_chars(self, text: str, param: str) -> None:
        if len(text) > self.max_prompt_chars:
            raise APIError(
                f"the prompt is {len(text)} characters long, over this server's limit of "
                f"{self.max_prompt_chars} characters (--max-prompt-chars): it cannot fit "
                f"the model's maximum context length of {self.max_model_len} tokens",
                param=param,
                code="context_length_exceeded",
            )

    async def _collect(self, stream: RequestStream, raw: Request) -> RequestOutput:
        """The finished output; aborts the request if the client disconnects first."""

        async def consume() -> RequestOutput:
            final = None
            async for output in stream:
                final = output
            assert final is not None
            return final

        consumer = asyncio.ensure_future(consume())
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            stream.abort()  # a no-op when it finished
            if not consumer.done():
                consumer.cancel()
                # Let the cancellation land: until it has, the task is neither done nor cancelled.
                await asyncio.wait({consumer})
        if consumer.cancelled():
            raise APIError("client disconnected", status_code=499, code="client_disconnected")
        try:
            return consumer.result()
        except EngineDeadError as exc:
            raise APIError(str(exc), status_code=503, code="engine_unavailable") from exc
        except ServerShutdownError as exc:
            raise APIError(str(exc), status_code=503, code="server_shutting_down") from exc
        except EngineError as exc:
            raise APIError(str(exc), status_code=500, code="engine_error") from exc

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _top(self, entry: dict[int, Logprob], n: int) -> list[tuple[str, float]]:
        best = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:n]
        return [(self._token_text(t), json_logprob(lp.logprob)) for t, lp in best]

    def _completion_logprobs(
        self,
        token_ids: list[int],
        entries: list[dict[int, Logprob] | None] | None,
        n: int,
        offset: int,
    ) -> tuple[dict, int]:
        """OpenAI's legacy logprobs object; `offset` is where the first token's text starts."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries or []):
            text = self._token_text(token_id)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if entry is None:  # an echoed prompt's first token: nothing comes before it
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(
                json_logprob(entry[token_id].logprob) if token_id in entry else None
            )
            top: dict[str, float] = {}
            # The sampled token and the n most likely (vLLM's: n + 1 entries when the sampled
            # token is not among those n).
            for token_text, logprob in self._top(entry, n + 1):
                # Tokens can share a text (two halves of different UTF-8 characters both show as
                # U+FFFD): keep the most likely, which `_top` lists first.
                top.setdefault(token_text, logprob)
            top_logprobs.append(top)
        logprobs = {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }
        return logprobs, offset

    def _chat_logprobs(
        self, token_ids: list[int], entries: list[dict[int, Logprob]] | None, n: int
    ) -> dict:
        content = []
        for token_id, entry in zip(token_ids, entries or []):
            text = self._token_text(token_id)
            content.append(
                {
                    "token": text,
                    "logprob": json_logprob(entry[token_id].logprob) if token_id in entry else None,
                    "bytes": list(text.encode("utf-8")),
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                        for t, lp in self._top(entry, n)
                    ],
                }
            )
        return {"content": content}


def context_length_check(
    max_tokens: int | None, max_model_len: int, param: str
) -> Callable[[int], None] | None:
    """vLLM's server rule: prompt + max_tokens must fit max_model_len, else a 400 naming both
    (OpenAI's code `context_length_exceeded`). The check runs once the prompt is tokenized, in
    the handler (`OpenAIServing._add`). None when there is nothing to check: no max_tokens
    means the rest of the context."""
    if max_tokens is None:
        return None

    def check(num_prompt_tokens: int) -> None:
        room = max_model_len - num_prompt_tokens
        if room >= 1 and max_tokens > room:  # no room at all: the engine names the prompt
            raise APIError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {max_model_len} tokens and your request "
                f"has {num_prompt_tokens} input tokens ({max_tokens} > {max_model_len} - "
                f"{num_prompt_tokens}).",
                param=param,
                code="context_length_exceeded",
            )

    return check


def max_chars_per_token(tokenizer: Any) -> int:
    """A generous bound on the characters one token stands for: twice its longest token's text.

    A byte-level BPE token's text has one character per byte, and a character is at least one
    byte, so no prompt has more characters than its tokens' texts (SentencePiece's `▁` is one
    character for one space). Twice that leaves room for a normalizer that drops or merges
    characters. A prompt longer than max_model_len times this cannot fit the context.
    """
    longest = max(
        (
            len(t)
            for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            if isinstance(t, str)
        ),
        default=1,
    )
    return 2 * max(longest, 1)


def json_logprob(logprob: float) -> float:
    """A logprob JSON can carry: a token the request masked out (`allowed_token_ids`) has
    logprob -inf, which JSON has no number for; it is sent as -9999.0, as vLLM's server does."""
    return max(logprob, -9999.0)


def _engine_error_code(exc: EngineError) -> str:
    if isinstance(exc, EngineDeadError):
        return "engine_unavailable"
    if isinstance(exc, ServerShutdownError):
        return "server_shutting_down"
    return "engine_error"


def _merge(
    outputs: list[RequestOutput],
) -> tuple[RequestOutput, list[tuple[CompletionOutput, str, list[int]]]]:
    """Several outputs of one request as one: the latest state, and for each completion its
    latest state with the text and token ids it gained over all of them."""
    last = outputs[-1]
    moved = []
    for completion in last.outputs:
        i = completion.index
        text = "".join(o.outputs[i].delta_text for o in outputs)
        token_ids = [t for o in outputs for t in o.outputs[i].delta_token_ids]
        moved.append((completion, text, token_ids))
    return last, moved


def _finish_once(completion: CompletionOutput, finished: set[int]) -> str | None:
    """The completion's finish reason the first time it is seen finished, else None."""
    if completion.finish_reason is None or completion.index in finished:
        return None
    finished.add(completion.index)
    return completion.finish_reason


def _text_choice(
    index: int, text: str, logprobs: dict | None, finish: str | None, stop: int | str | None
) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": stop,
    }


@dataclasses.dataclass
class Echo:
    """`echo`: the prompt's text, put before a choice's text, and its token ids, put before
    the choice's tokens in its logprobs (with the prompt's logprobs, the first one None)."""

    text: str
    token_ids: list[int]

    def before(
        self,
        token_ids: list[int],
        entries: list[dict[int, Logprob] | None],
        prompt_logprobs: list[dict[int, Logprob] | None] | None,
    ) -> tuple[list[int], list[dict[int, Logprob] | None]]:
        prompt_entries = list(prompt_logprobs or [None] * len(self.token_ids))
        return [*self.token_ids, *token_ids], [*prompt_entries, *entries]


def _prompt_logprobs_json(entries: list[dict[int, Logprob] | None] | None) -> list | None:
    """vLLM's `prompt_logprobs` in a response: per prompt token, None or {token id: Logprob}."""
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            str(t): dataclasses.asdict(dataclasses.replace(lp, logprob=json_logprob(lp.logprob)))
            for t, lp in entry.items()
        }
        for entry in entries
    ]


def _usage(output: RequestOutput) -> dict[str, int]:
    prompt = len(output.prompt_token_ids)
    completion = sum(len(c.token_ids) for c in output.outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


async def _wait_for_disconnect(raw: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return
