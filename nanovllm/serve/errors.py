"""OpenAI-style errors: every failure a client can cause is a 4xx in one JSON shape.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
               "code": "invalid_value"}}

OpenAI's clients read this shape (`openai.BadRequestError.body`), so a bad request surfaces in
the caller's language as a clear exception naming the bad field. FastAPI's own failures are
translated into it as well: its validation errors (422 by default) become 400s like OpenAI's,
and its 404/405s get the same body. Anything unexpected is a 500 in the same shape, never a
traceback on the wire.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("nanovllm.serve")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response (documented in the OpenAPI schema)."""

    error: ErrorInfo


class APIError(Exception):
    """Raised anywhere in a handler; turned into an OpenAI-shaped JSON error response."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = "invalid_value",
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type or error_type(status_code)
        self.headers = headers  # sent with the response (`Retry-After`, `Connection`)


def error_type(status_code: int) -> str:
    if status_code == 404:
        return "not_found_error"
    return "invalid_request_error" if status_code < 500 else "server_error"


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status_code,
        headers=exc.headers,
    )


_LEADING_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)")


def param_from_message(message: str, known: set[str]) -> str | None:
    """The field a `ValueError` from SamplingParams is about: its messages start with the name."""
    match = _LEADING_NAME.match(message)
    return match.group(1) if match and match.group(1) in known else None


# Parts of a pydantic error location that name a union branch ("str", "list[int]"), not a field.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list|dict)$|[\[\]()-]")


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc[1:] if not (isinstance(p, str) and _UNION_TAG.search(p))]
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic error, worded for a person and naming the field."""
    errors = exc.errors()
    if not errors:
        return APIError("invalid request body", code="invalid_request")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    kind = first.get("type", "")
    param = _param_from_loc(loc) if loc[:1] == ("body",) else ".".join(map(str, loc)) or None
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error") or first.get("msg")
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        return APIError(f"the request body is not valid JSON: {detail}{where}", code=kind)
    if kind == "extra_forbidden":
        return APIError(f"Unrecognized request argument supplied: {param}", param=param, code=kind)
    if param is None:
        message = f"invalid request body: {first.get('msg')}"
    else:
        message = f"{param}: {first.get('msg')}"
    return APIError(message, param=param, code=kind or "invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's only 400 is a body its parser could not read (body.py refuses the known
        # causes first, with their own codes).
        code = "invalid_body" if exc.status_code == 400 else None
        error = APIError(str(exc.detail), status_code=exc.status_code, code=code)
        return JSONResponse(
            error_body(error.message, error.type, None, code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body(f"internal server error: {type(exc).__name__}", "server_error"),
            status_code=500,
        )
