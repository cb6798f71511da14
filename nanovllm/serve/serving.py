"""The generation endpoints: `/v1/completions` and `/v1/chat/completions`, streamed or not.

Each prompt of an HTTP request becomes one engine request (a completion's `prompt` may be a
batch of them, as in vLLM; a chat has one):

    body (pydantic) -> SamplingParams + prompts -> AsyncLLMEngine.add_request, per prompt
        -> RequestStreams, merged into one (merged_stream.py)
        stream=false: wait for the finished outputs -> one JSON response
        stream=true:  each output -> one SSE chunk (its completions' `delta_text`) ... -> [DONE]

Prompt i's completion j is choice `index` i * n + j (vLLM's numbering), and `usage` sums every
prompt and completion. A chat request with `tools` has them rendered by the chat template and
its output read as tool calls per `tool_choice` (`tools.py`, `ToolDeltas` for streams).

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
from nanovllm.sampling_params import SamplingParams, encode_truncated, truncate_prompt
from nanovllm.serve.async_engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineError,
    RequestStream,
    ServerShutdownError,
)
from nanovllm.serve.errors import APIError, error_body, param_from_message
from nanovllm.serve.merged_stream import MergedStream
from nanovllm.serve.protocol import ChatCompletionRequest, CompletionRequest
from nanovllm.serve.sse import DONE, ClosingStreamingResponse, sse_data
from nanovllm.serve.tools import (
    HermesToolParser,
    NamedToolChoice,
    make_tool_call_id,
    required_tool_calls,
    tool_call,
)

# Keys vLLM's stream chunks carry, null here: a chat stream's first chunk of each choice has the
# prompt's (`prompt_token_ids`, `prompt_text`); the chunk that finishes a choice, or the usage
# chunk when there is one, has `system_fingerprint`.
FIRST_CHAT_CHUNK_KEYS: dict[str, Any] = {"prompt_token_ids": None, "prompt_text": None}
FINAL_CHUNK_KEYS: dict[str, Any] = {"system_fingerprint": None}


class OpenAIServing:
    def __init__(
        self,
        engine: AsyncLLMEngine,
        tokenizer: Any,
        model_name: str | list[str],
        chat_template: str | None = None,
        max_prompt_chars: int | None = None,
        tool_call_parser: str | None = None,
        count_tool_parse: Callable[[bool, bool], None] | None = None,
    ) -> None:
        self.engine = engine
        # `--enable-auto-tool-choice --tool-call-parser NAME`: "auto" tool choice (tools.py).
        self.tool_parser = tool_call_parser
        # Told (tool_called, streaming) each time the parser reads a choice's output or a
        # streamed delta: vLLM's tool_call_parser_invocations (metrics.py).
        self.count_tool_parse = count_tool_parse or (lambda tool_called, streaming: None)
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
        prompts = body.engine_prompts()
        request_id = f"cmpl-{uuid.uuid4().hex}"
        # Every prompt is checked before any is added (as vLLM renders them all first), so a
        # bad prompt anywhere in a batch is a 400 with nothing left running.
        k = body.truncate_prompt_tokens
        inputs = [await self._prepare(p, params, k, "prompt", "max_tokens") for p in prompts]
        if len(inputs) == 1:
            streams = [await self._add(request_id, *inputs[0], params, "prompt")]
        else:
            streams = await self._add_batch(request_id, inputs, params)
        stream = MergedStream(request_id, streams)
        echoes = None
        if body.echo:
            echoes = [
                Echo(text if text is not None else self.tokenizer.decode(ids), ids)
                for text, ids in inputs
            ]
        created = int(time.time())
        if body.stream:
            return ClosingStreamingResponse(
                self._completion_chunks(stream, body, created, echoes), on_close=stream.abort
            )
        finals = await self._collect(stream, raw)
        choices = []
        for prompt_index, final in enumerate(finals):
            echo = echoes[prompt_index] if echoes is not None else None
            for out in final.outputs:
                logprobs = None
                out_ids, entries = list(out.token_ids), list(out.logprobs or [])
                if echo is not None:
                    out_ids, entries = echo.before(out_ids, entries, final.prompt_logprobs)
                if params.logprobs is not None:
                    logprobs, _ = self._completion_logprobs(out_ids, entries, params.logprobs, 0)
                choices.append(
                    {
                        "index": len(choices),  # prompt-major: prompt i's j-th is i * n + j
                        "text": (echo.text if echo is not None else "") + out.text,
                        "logprobs": logprobs,
                        "finish_reason": out.finish_reason,
                        "stop_reason": out.stop_reason,
                        "token_ids": None,
                        "prompt_logprobs": prompt_logprobs_json(
                            final.prompt_token_ids, final.prompt_logprobs
                        ),
                        "prompt_token_ids": None,
                        "routed_experts": None,
                    }
                )
        return JSONResponse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": _usage_details(finals),
                "kv_transfer_params": None,
            }
        )

    async def _completion_chunks(
        self,
        stream: MergedStream,
        body: CompletionRequest,
        created: int,
        echoes: list[Echo] | None,
    ) -> AsyncIterator[str]:
        def chunk(choices: list[dict], usage: dict | None = None, final: bool = False) -> str:
            extra = FINAL_CHUNK_KEYS if final else None
            return self._chunk("text_completion", stream.request_id, created, choices, usage, extra)

        num_prompts = len(stream.streams)
        offsets = [0] * (body.n * num_prompts)  # where each choice's next logprob token starts
        finished: set[int] = set()
        echoed: set[int] = set()
        finals: list[RequestOutput | None] = [None] * num_prompts
        try:
            async for item in stream:
                for prompt_index, last, moved in _merge_batch([item, *stream.drain_ready()]):
                    finals[prompt_index] = last
                    echo = echoes[prompt_index] if echoes is not None else None
                    for out, text, token_ids in moved:
                        index = prompt_index * body.n + out.index  # vLLM's numbering
                        entries = (
                            out.logprobs[-len(token_ids) :] if token_ids and out.logprobs else []
                        )
                        prompt_token_ids = None
                        if echo is not None and index not in echoed:
                            echoed.add(index)
                            text = echo.text + text
                            token_ids, entries = echo.before(
                                token_ids, entries, last.prompt_logprobs
                            )
                            prompt_token_ids = echo.token_ids
                        logprobs = None
                        if body.logprobs is not None and token_ids:
                            logprobs, offsets[index] = self._completion_logprobs(
                                token_ids, entries, body.logprobs, offsets[index]
                            )
                        finish = _finish_once(index, out, finished)
                        if text or finish or logprobs:
                            stop = out.stop_reason if finish else None
                            choice = _text_choice(index, text, logprobs, finish, stop)
                            choice["prompt_token_ids"] = prompt_token_ids
                            choice["token_ids"] = None
                            yield chunk([choice], final=bool(finish) and not body.include_usage)
                if body.include_usage and all(f is not None and f.finished for f in finals):
                    yield chunk([], _usage(finals), final=True)  # type: ignore[arg-type]
        except EngineError as exc:
            yield sse_data(error_body(str(exc), "server_error", None, _engine_error_code(exc)))
        yield DONE

    # --- /v1/chat/completions -------------------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(body.model)
        if body.tools and body.effective_tool_choice == "auto" and self.tool_parser is None:
            raise APIError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set",
                param="tool_choice",
            )
        params = body.to_sampling_params()
        prompt = await self._chat_prompt(body)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        max_tokens_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        text, token_ids = await self._prepare(
            prompt, params, body.truncate_prompt_tokens, "messages", max_tokens_param
        )
        stream = MergedStream(
            request_id, [await self._add(request_id, text, token_ids, params, "messages")]
        )
        created = int(time.time())
        if body.stream:
            return ClosingStreamingResponse(
                self._chat_chunks(stream, body, created), on_close=stream.abort
            )
        (final,) = await self._collect(stream, raw)
        choices = []
        for out in final.outputs:
            logprobs = None
            if params.logprobs is not None:
                logprobs = self._chat_logprobs(out.token_ids, out.logprobs, params.logprobs)
            message, called = self._tool_message(body, out.text, out.finish_reason)
            choices.append(
                {
                    "index": out.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": "tool_calls" if called else out.finish_reason,
                    "stop_reason": out.stop_reason,
                    "token_ids": None,
                    "routed_experts": None,
                }
            )
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": _usage_details([final]),
                "prompt_logprobs": prompt_logprobs_json(
                    final.prompt_token_ids, final.prompt_logprobs
                ),
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
            }
        )

    async def _chat_prompt(self, body: ChatCompletionRequest) -> dict[str, Any]:
        """The conversation's text and token ids (`render_chat`), its tools in the template."""
        text, token_ids = await self.render_chat(
            body.template_messages(), body.add_generation_prompt, body.tool_dicts()
        )
        return {"prompt": text, "prompt_token_ids": token_ids}

    def _tool_message(
        self, body: ChatCompletionRequest, text: str, finish_reason: str | None
    ) -> tuple[dict[str, Any], bool]:
        """A finished choice's message, and whether its finish reason is `tool_calls`, as
        vLLM's server answers (`tools.py`): a named tool's arguments are the output; a required
        call list is the output's JSON; with "auto" the parser finds the calls, if any."""
        choice = body.effective_tool_choice
        if not body.tools or choice == "none":
            return _assistant_message(text), False
        if isinstance(choice, NamedToolChoice):
            return _assistant_message("", [tool_call(choice.function.name, text)]), False
        if choice == "required":
            try:
                calls = required_tool_calls(text)
            except (ValueError, KeyError, TypeError):  # cut short by max_tokens: not JSON yet
                return _assistant_message(""), False  # vLLM's: no calls, content ""
            return _assistant_message("", calls), finish_reason == "stop"
        content, calls = HermesToolParser().extract_tool_calls(text)
        self.count_tool_parse(bool(calls), False)
        if not calls:
            return _assistant_message(text), False
        return _assistant_message(content, calls), True

    async def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        add_special_tokens: bool = False,
    ) -> tuple[str, list[int]]:
        """A conversation's text, by the chat template, and its token ids, rendered and
        tokenized on the tokenizer thread (the text is measured first: `_check_chars`)."""
        try:
            template = resolve_chat_template(
                self.tokenizer,
                self.chat_template,
                self.model_name,
                fix="use /v1/completions, or start the server with --chat-template FILE",
            )
        except ValueError as exc:
            raise APIError(str(exc), param="messages", code="chat_template_missing") from exc

        def render() -> tuple[str, list[int]]:  # on the tokenizer thread
            try:
                text = render_chat_text(
                    self.tokenizer,
                    messages,
                    template,
                    add_generation_prompt=add_generation_prompt,
                    tools=tools or None,
                )
            except ValueError as exc:
                raise APIError(f"messages: {exc}", param="messages") from exc
            self._check_chars(text, "messages")
            token_ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
            return text, list(token_ids)

        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, render)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A text's token ids, on the tokenizer thread (measured first: `_check_chars`)."""
        self._check_chars(text, "prompt")
        return list(
            await asyncio.get_running_loop().run_in_executor(
                self._tokenizer_thread,
                lambda: self.tokenizer.encode(text, add_special_tokens=add_special_tokens),
            )
        )

    async def _chat_chunks(
        self, stream: MergedStream, body: ChatCompletionRequest, created: int
    ) -> AsyncIterator[str]:
        def chunk(
            choices: list[dict], usage: dict | None = None, first: bool = False, final: bool = False
        ) -> str:
            extra = FIRST_CHAT_CHUNK_KEYS if first else FINAL_CHUNK_KEYS if final else None
            return self._chunk(
                "chat.completion.chunk", stream.request_id, created, choices, usage, extra
            )

        def choice(index: int, delta: dict, logprobs: dict | None, finish: str | None) -> dict:
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

        top_n = (body.top_logprobs or 0) if body.logprobs else None
        finished: set[int] = set()
        tool_deltas = ToolDeltas(body, self.count_tool_parse) if body.tools else None
        try:
            role = {"role": "assistant", "content": ""}
            for i in range(body.n):
                # vLLM's first chunks carry the prompt's keys (null unless asked for).
                yield chunk([choice(i, role, None, None)], first=True)
            async for item in stream:
                ((_, last, moved),) = _merge_batch([item, *stream.drain_ready()])
                for out, text, token_ids in moved:
                    logprobs = None
                    if top_n is not None and token_ids:
                        entries = out.logprobs[-len(token_ids) :] if out.logprobs else []
                        logprobs = self._chat_logprobs(token_ids, entries, top_n)
                    finish = _finish_once(out.index, out, finished)
                    delta = {"content": text} if text else {}
                    if tool_deltas is not None:
                        delta = tool_deltas.delta(out.index, text, finish, bool(token_ids))
                        if finish and tool_deltas.called(out.index, finish):
                            finish = "tool_calls"
                    if delta or finish or logprobs:
                        moved_choice = choice(out.index, delta, logprobs, finish)
                        if finish:
                            moved_choice["stop_reason"] = out.stop_reason
                        moved_choice["token_ids"] = None
                        yield chunk([moved_choice], final=bool(finish) and not body.include_usage)
                if last.finished and body.include_usage:
                    yield chunk([], _usage([last]), final=True)
        except EngineError as exc:
            yield sse_data(error_body(str(exc), "server_error", None, _engine_error_code(exc)))
        yield DONE

    # --- shared ---------------------------------------------------------------------------------

    def _chunk(
        self,
        kind: str,
        request_id: str,
        created: int,
        choices: list[dict],
        usage: dict | None,
        extra: dict | None = None,
    ) -> str:
        """One SSE chunk; `usage` only on the last one (with `stream_options.include_usage`);
        `extra`: keys added after `choices`."""
        payload: dict[str, Any] = {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": self.model_name,
            "choices": choices,
            **(extra or {}),
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

    async def _prepare(
        self,
        prompt: Prompt,
        params: SamplingParams,
        truncate_prompt_tokens: int | None,
        prompt_param: str,
        max_tokens_param: str,
    ) -> tuple[str | None, list[int]]:
        """A prompt's text (None when unknown) and token ids, as the engine will get them
        (after `truncate_prompt_tokens`), checked against the context length."""
        text, token_ids = await self._tokenize(prompt, prompt_param, truncate_prompt_tokens)
        check = context_length_check(params.max_tokens, self.max_model_len, max_tokens_param)
        if check is not None:
            check(len(token_ids))
        return text, token_ids

    async def _add(
        self,
        request_id: str,
        text: str | None,
        token_ids: list[int],
        params: SamplingParams,
        prompt_param: str,
    ) -> RequestStream:
        """The stream of a prepared prompt's request, once the engine has accepted it."""
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
            return await self.engine.add_request(request_id, engine_prompt, params)
        except EngineDeadError as exc:
            raise APIError(str(exc), status_code=503, code="engine_unavailable") from exc
        except ValueError as exc:
            message = str(exc)
            param = "max_tokens" if "max_tokens=" in message else prompt_param
            param = param_from_message(message, set(SamplingParams.__dataclass_fields__)) or param
            if message.startswith("structured_outputs"):  # a constraint that does not compile
                param = "response_format"
            raise APIError(message, param=param) from exc

    async def _add_batch(
        self,
        request_id: str,
        inputs: list[tuple[str | None, list[int]]],
        params: SamplingParams,
    ) -> list[RequestStream]:
        """One engine request per prompt of a batch (`{request_id}-{i}`, vLLM's ids); if the
        engine refuses one, those already added are aborted and the refusal names the prompt."""
        if (params.extra_args or {}).get("kv_transfer_params"):
            raise APIError(
                "kv_transfer_params names one transfer: send one prompt per request with it",
                param="kv_transfer_params",
                code="unsupported_parameter",
            )
        streams: list[RequestStream] = []
        try:
            for i, (text, token_ids) in enumerate(inputs):
                streams.append(
                    await self._add(f"{request_id}-{i}", text, token_ids, params, "prompt")
                )
        except APIError as exc:
            exc.message = f"prompt[{len(streams)}]: {exc.message}"
            exc.args = (exc.message,)
            raise
        finally:
            if len(streams) < len(inputs):
                for stream in streams:
                    stream.abort()
        return streams

    async def _tokenize(
        self, prompt: Prompt, param: str, k: int | None
    ) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt, cut to `truncate_prompt_tokens`; a 400 naming its
        size, before any heavy work, when it cannot fit the context whatever its tokens. (A
        chat's prompt comes tokenized.)"""
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
                    self._tokenizer_thread,
                    encode_truncated,
                    self.tokenizer,
                    prompt,
                    k,
                    self.max_model_len,
                )
                return None, list(token_ids)
            return truncate_prompt((prompt, list(token_ids)), k, self.max_model_len)
        text = prompt.get("prompt") if isinstance(prompt, dict) else None
        token_ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
        text, token_ids = truncate_prompt((text, list(token_ids)), k, self.max_model_len)
        if len(token_ids) > self.max_model_len:
            raise APIError(
                f"prompt of {len(token_ids)} tokens does not fit max_model_len="
                f"{self.max_model_len} (refused before any other check)",
                param=param,
                code="context_length_exceeded",
            )
        return text, token_ids

    def _check_chars(self, text: str, param: str) -> None:
        if len(text) > self.max_prompt_chars:
            raise APIError(
                f"the prompt is {len(text)} characters long, over this server's limit of "
                f"{self.max_prompt_chars} characters (--max-prompt-chars): it cannot fit "
                f"the model's maximum context length of {self.max_model_len} tokens",
                param=param,
                code="context_length_exceeded",
            )

    async def _collect(self, stream: MergedStream, raw: Request) -> list[RequestOutput]:
        """Each prompt's finished output; aborts the requests if the client disconnects first."""
        consumer = asyncio.ensure_future(stream.finals())
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


def _merge_batch(
    items: list[tuple[int, RequestOutput]],
) -> list[tuple[int, RequestOutput, list[tuple[CompletionOutput, str, list[int]]]]]:
    """Several outputs of a batch's requests, one merged output per prompt (in the order the
    prompts first appear): its latest state, and for each completion its latest state with the
    text and token ids it gained over all of them."""
    by_prompt: dict[int, list[RequestOutput]] = {}
    for prompt_index, output in items:
        by_prompt.setdefault(prompt_index, []).append(output)
    merged = []
    for prompt_index, outputs in by_prompt.items():
        last = outputs[-1]
        moved = []
        for completion in last.outputs:
            i = completion.index
            text = "".join(o.outputs[i].delta_text for o in outputs)
            token_ids = [t for o in outputs for t in o.outputs[i].delta_token_ids]
            moved.append((completion, text, token_ids))
        merged.append((prompt_index, last, moved))
    return merged


def _finish_once(index: int, completion: CompletionOutput, finished: set[int]) -> str | None:
    """The completion's finish reason the first time choice `index` is seen finished."""
    if completion.finish_reason is None or index in finished:
        return None
    finished.add(index)
    return completion.finish_reason


class ToolDeltas:
    """A streamed chat choice's deltas when the request has tools, as vLLM sends them: a named
    tool's arguments as they grow (the first delta with the call's id and name); a required
    call list whole, once the output is complete (it is JSON only then); with "auto", the
    parser's deltas (`HermesToolParser.extract_streaming`); with "none", the text.
    `count_tool_parse(tool_called, streaming=True)` is told of each delta the parser reads."""

    def __init__(
        self, body: ChatCompletionRequest, count_tool_parse: Callable[[bool, bool], None]
    ) -> None:
        self.choice = body.effective_tool_choice
        self.count_tool_parse = count_tool_parse
        self.texts: dict[int, str] = {}
        self.parsers: dict[int, HermesToolParser] = {}
        self.required_calls: dict[int, bool] = {}

    def delta(self, index: int, text: str, finish: str | None, moved: bool) -> dict[str, Any]:
        """Choice `index`'s delta for `text` (`moved`: it carries new tokens; a choice of a
        request with n > 1 is also handed the steps that moved only its siblings)."""
        before = self.texts.get(index, "")
        self.texts[index] = whole = before + text
        if self.choice == "none":
            return {"content": text} if text else {}
        if isinstance(self.choice, NamedToolChoice):
            if not text:
                return {}
            call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if not before:
                call = {
                    "index": 0,
                    "id": make_tool_call_id(),
                    "type": "function",
                    "function": {"name": self.choice.function.name, "arguments": text},
                }
            return {"tool_calls": [call]}
        if self.choice == "required":
            if finish is None:
                return {}
            try:
                calls = required_tool_calls(whole)
            except (ValueError, KeyError, TypeError):  # cut short: not JSON, nothing sent
                return {}
            self.required_calls[index] = True
            return {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
        parser = self.parsers.setdefault(index, HermesToolParser())
        delta = parser.extract_streaming(whole) or {}
        if moved:  # vLLM reads (and counts) each output that brought a choice tokens
            self.count_tool_parse(bool(delta.get("tool_calls")), True)
        return delta

    def called(self, index: int, finish: str) -> bool:
        """Whether the finished choice's finish reason is `tool_calls` (vLLM's rule)."""
        if self.choice == "required":
            return self.required_calls.get(index, False) and finish == "stop"
        parser = self.parsers.get(index)
        return parser is not None and parser.tools_called


def _assistant_message(
    content: str | None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A chat choice's message with every key vLLM's has (null where nanovllm has nothing;
    `tool_calls` only when there are some, as vLLM sends it)."""
    message = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


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


def prompt_logprobs_json(
    prompt_token_ids: list[int], entries: list[dict[int, Logprob] | None] | None
) -> list | None:
    """vLLM's `prompt_logprobs` in a response: per prompt token, None or {token id: Logprob},
    the prompt's own token first, then the most likely by rank (vLLM's order)."""
    if entries is None:
        return None

    def one(token_id: int, entry: dict[int, Logprob]) -> dict[str, dict]:
        order = sorted(entry, key=lambda t: (t != token_id, -entry[t].logprob))
        return {
            str(t): dataclasses.asdict(
                dataclasses.replace(entry[t], logprob=json_logprob(entry[t].logprob))
            )
            for t in order
        }

    return [
        None if entry is None else one(token_id, entry)
        for token_id, entry in zip(prompt_token_ids, entries)
    ]


def _usage(finals: list[RequestOutput]) -> dict[str, Any]:
    """Tokens over every prompt of the request and every completion of each, as vLLM sums them."""
    prompt = sum(len(o.prompt_token_ids) for o in finals)
    completion = sum(len(c.token_ids) for o in finals for c in o.outputs)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def _usage_details(finals: list[RequestOutput]) -> dict[str, Any]:
    """A response's `usage`: a stream's keys, and the details vLLM sends as null."""
    return {**_usage(finals), "prompt_tokens_details": None, "completion_tokens_details": None}


async def _wait_for_disconnect(raw: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return
