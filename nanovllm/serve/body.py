"""A request body's checks before it is parsed as JSON: its content type, encoding and depth.

FastAPI parses a body as JSON only when its `Content-Type` says JSON (otherwise the model sees
raw bytes, and the client a validation error that never mentions the content type), and answers
one vague "There was an error parsing the body" (code null) for bytes that are not UTF-8 and for
JSON nested deeper than the parser can recurse. The guard (guard.py) runs `check_json_body` on
the buffered body of every generation request first, so each of these is a clear error:

    415 unsupported_media_type  the Content-Type is missing or is not JSON (`application/json`,
                                or `application/<anything>+json` as FastAPI accepts). Not taken
                                leniently: `text/plain` is one of the types any web page may
                                POST to another origin without a CORS preflight, so accepting it
                                would let every page a user opens drive a server on their own
                                machine. FastAPI (and so vLLM) does not parse it either.
    400 invalid_utf8            the bytes are not UTF-8 (JSON between systems is UTF-8, RFC 8259):
                                the message names the first bad byte and its offset
    400 json_too_deep           arrays and objects nested deeper than MAX_JSON_DEPTH: measured
                                without recursion, before the parser (which recurses once per
                                level) sees the body

An OpenAI request nests a few levels (a message's content parts are at depth 4); a JSON schema
in a request nests deeper, which is why the limit is serde_json's 128 and not lower.

This file imports only the standard library at import time (numpy is loaded by the first
check), like guard.py, so `nanovllm serve --help` stays light.
"""

from __future__ import annotations

import re
from email.message import Message

MAX_JSON_DEPTH = 128

# A JSON string (its escapes included), written so that the regex engine never backtracks.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


class BodyError(ValueError):
    """A body refused before parsing: the HTTP status, OpenAI's `code`, the message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def check_json_body(content_type: str | None, body: bytes) -> None:
    """Raise `BodyError` when `body`, sent with `content_type`, is not JSON a parser can take."""
    check_content_type(content_type)
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            400,
            "invalid_utf8",
            f"the request body is not valid UTF-8: byte 0x{body[exc.start]:02x} at offset "
            f"{exc.start} ({exc.reason}); send the JSON encoded as UTF-8",
        ) from None
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise BodyError(
            400,
            "json_too_deep",
            f"the request body nests arrays and objects {depth} levels deep; the server "
            f"accepts at most {MAX_JSON_DEPTH}",
        )


def check_content_type(content_type: str | None) -> None:
    if not content_type:
        raise BodyError(
            415,
            "unsupported_media_type",
            "the request has no Content-Type header; send the JSON body with "
            "'Content-Type: application/json'",
        )
    header = Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    if header.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        raise BodyError(
            415,
            "unsupported_media_type",
            f"Content-Type {content_type!r} is not supported; send the JSON body with "
            "'Content-Type: application/json'",
        )


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not
    count). Linear in the body's length, and no recursion, whatever the depth."""
    import numpy as np

    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", body))
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
    steps -= np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))
