"""The FastAPI application: OpenAI's routes plus health, metrics and the engine's event stream.

    POST /v1/completions        text completion, `stream` true or false
    POST /v1/chat/completions   chat, through the tokenizer's chat template
    POST /tokenize, /detokenize vLLM's: a prompt's (or a chat's) token ids, and ids' text
    GET  /version               the server's version, as vLLM's `{"version": ...}`
    GET  /v1/models             the model served: one card per served name, as vLLM's (`root`
                                the model's path, `parent` null, `permission`, `max_model_len`)
    GET  /health                200 while the engine runs, else 503 naming why (a dead rank,
                                a server draining after SIGTERM...)
    GET  /metrics               Prometheus' format, vLLM's metric names (see metrics.py)
    GET  /v1/events, /events    the engine's events as SSE (see event_stream.py)
    GET  /docs, /openapi.json   FastAPI's documentation of all of the above

Every request passes `RequestGuard` (guard.py) first: the API key, the body size limit and the
limit on concurrent generation requests.

`build_app` wires an `AsyncLLMEngine` (which owns the engine thread) into the routes; it does
not start or stop the engine, so tests and the CLI decide its lifetime, and several apps can
share one engine. Each app has its own metrics registry, fed by that engine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from nanovllm.serve.async_engine import AsyncLLMEngine, EngineDeadError
from nanovllm.serve.errors import APIError, ErrorResponse
from nanovllm.serve.event_stream import event_sse
from nanovllm.serve.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    guarded_app,
)
from nanovllm.serve.metrics import ServerMetrics, ToolParserInvocations
from nanovllm.serve.openapi import describe_server
from nanovllm.serve.protocol import ChatCompletionRequest, CompletionRequest
from nanovllm.serve.serving import OpenAIServing
from nanovllm.serve.sse import ClosingStreamingResponse
from nanovllm.serve.tokenization import (
    DetokenizeRequest,
    ServingTokenization,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from nanovllm.serve.tools import TOOL_CALL_PARSERS

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request (the field is named)"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (with --api-key)"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
    503: {
        "model": ErrorResponse,
        "description": "The engine is not running, or the server is shutting down",
    },
}
_GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A JSON completion, or with `stream: true` server-sent events "
        "ending with `data: [DONE]`",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_ERRORS,
    413: {"model": ErrorResponse, "description": "The request body is over the size limit"},
    429: {"model": ErrorResponse, "description": "Too many concurrent requests: retry later"},
}


def nanovllm_version() -> str:
    try:
        return package_version("nanovllm")
    except PackageNotFoundError:  # a checkout run without installing it
        return "0.0.0+unknown"


def build_app(
    engine: AsyncLLMEngine,
    *,
    served_model_name: str | list[str] | None = None,
    model_root: str | None = None,
    chat_template: str | None = None,
    tokenizer: Any = None,
    api_key: str | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    max_concurrent_requests: int | None = DEFAULT_MAX_CONCURRENT_REQUESTS,
    max_prompt_chars: int | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
    tool_call_parser: str | None = None,
    enable_auto_tool_choice: bool = True,
) -> FastAPI:
    """The server's app. `chat_template` (Jinja text) overrides the tokenizer's own; `api_key`,
    `max_request_body_bytes`, `max_concurrent_requests` (None: no limit) and `body_timeout`
    are the guard's;
    `max_prompt_chars` (None: derived from max_model_len, serving.py) refuses longer text
    prompts before they are tokenized. `served_model_name` (one name or several, as vLLM's
    `--served-model-name`): requests may name any, responses and metrics name the first;
    None: the engine's model name. `model_root` is the model's path as the operator gave it
    (the cards' `root`; default: the folder it was loaded from). `tool_call_parser` (vLLM's
    `--tool-call-parser NAME`): how "auto" tool calls are read from the output, when
    `enable_auto_tool_choice` (vLLM's `--enable-auto-tool-choice`); otherwise "auto" tool choice
    is refused (tools.py). A parser named, enabled or not, puts vLLM's
    `vllm:tool_call_parser_invocations` on /metrics (metrics.py)."""
    if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"tool_call_parser must be one of {list(TOOL_CALL_PARSERS)}, got {tool_call_parser!r}"
        )
    if tokenizer is None:
        from nanovllm.models.loader import load_tokenizer, resolve_model_path

        # Our own tokenizer (see serving.py), from the same place as the engine's.
        given = engine.engine.config.tokenizer
        tokenizer = load_tokenizer(resolve_model_path(given) if given else engine.engine.model_path)
    if isinstance(served_model_name, str):
        served_model_name = [served_model_name]
    model_names = list(served_model_name or [engine.model_name])
    model_name = model_names[0]
    root = model_root or str(engine.engine.model_path)
    metrics = ServerMetrics(engine, model_name, engine.engine.max_model_len)
    tool_parse = None
    if tool_call_parser is not None:
        tool_parse = ToolParserInvocations(metrics.registry, model_name).record
    serving = OpenAIServing(
        engine,
        tokenizer,
        model_names,
        chat_template,
        max_prompt_chars,
        tool_call_parser if enable_auto_tool_choice else None,
        tool_parse,
    )
    tokenization = ServingTokenization(serving)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        metrics.close()  # the engine may outlive this app: stop feeding its histograms
        serving.close()

    app = guarded_app(
        "nanovllm",
        "An OpenAI-compatible streaming server on the nanovllm engine.",
        lifespan,
        api_key=api_key,
        max_request_body_bytes=max_request_body_bytes,
        max_concurrent_requests=max_concurrent_requests,
        body_timeout=body_timeout,
        max_model_len=engine.engine.max_model_len,
    )
    describe_server(  # the schema with this server's own bounds (openapi.py)
        app,
        model_name=model_names,
        max_model_len=engine.engine.max_model_len,
        vocab_size=engine.engine.model_args.vocab_size,
        api_key=bool(api_key),
    )
    app.state.engine = engine
    app.state.serving = serving
    app.state.metrics = metrics

    @app.post("/v1/completions", responses=_GENERATION_RESPONSES)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions", responses=_GENERATION_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await serving.chat(body, request)

    @app.post("/tokenize", responses=_ERRORS)
    async def tokenize(
        body: TokenizeCompletionRequest | TokenizeChatRequest,
    ) -> dict[str, Any]:
        return await tokenization.tokenize(body)

    @app.post("/detokenize", responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        return await tokenization.detokenize(body)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": nanovllm_version()}

    def model_card(name: str) -> dict[str, Any]:
        # vLLM's ModelCard and ModelPermission, field for field.
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "nanovllm",
            "root": root,
            "parent": None,
            "max_model_len": engine.engine.max_model_len,
            "permission": [permission],
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(name) for name in model_names]}

    @app.get("/v1/models/{model_id:path}", responses=_ERRORS)
    async def get_model(model_id: str) -> dict[str, Any]:
        serving.check_model(model_id)  # the 404 for another name
        return model_card(model_id)

    @app.get("/health", responses=_ERRORS)
    async def health() -> JSONResponse:
        if app.state.server_state.draining:
            raise APIError(
                "the server is shutting down: send the request to another server",
                status_code=503,
                code="server_shutting_down",
                headers={"Connection": "close", "Retry-After": "1"},  # as the guard's 503
            )
        reason = engine.dead_reason() or engine.stall_reason()
        if reason is not None:
            raise APIError(reason, status_code=503, code="engine_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=Response)
    async def get_metrics(request: Request) -> Response:
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    async def events() -> Response:
        try:
            stream = engine.subscribe_events()
        except EngineDeadError as exc:
            raise APIError(str(exc), status_code=503, code="engine_unavailable") from exc
        return ClosingStreamingResponse(event_sse(stream), on_close=stream.close)

    events_doc = "The engine's events as server-sent events (see nanovllm/serve/event_stream.py)."
    ev_responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "An endless SSE stream", "content": {"text/event-stream": {}}}
    }
    app.add_api_route(
        "/v1/events", events, methods=["GET"], description=events_doc, responses=ev_responses
    )
    app.add_api_route(
        "/events",
        events,
        methods=["GET"],
        description=events_doc,
        responses=ev_responses,
        include_in_schema=False,
    )
    return app
