"""A request body's checks before it is parsed as JSON: its content type, encoding and depth.

FastAPI parses a body as JSON only when its `Content-Type` says JSON (otherwise the model sees
raw bytes, and the client a validation error that never mentions the content type), and answers
one vague "There was an error parsing the body" (code null) for bytes that are not UTF-8 and for
JSON nested deeper than the parser can recurse. The guard (guard.py) runs `check_json_body` on
the buffered body of every generation request first, so each of these is a clear error:

    400 unsupported_media_type  the Content-Type is missing or is not JSON (`application/json`,
                                or `application/<anything>+json` as FastAPI accepts); 400 as
                                vLLM answers it (HTTP's own word would be 415). Not taken
                                leniently: `text/plain` is one of the types any web page may
                                POST to another origin without a CORS preflight, so accepting it
                                would let every page a user opens drive a server on their own
                                machine. FastAPI (and so vLLM) does not parse it either.
    400 invalid_utf8            the bytes are not UTF-8 (JSON between systems is UTF-8, RFC 8259):
                                the message names the first bad byte and its offset
    400 json_invalid            a NUL byte, never valid JSON (Python's json would take a body
                                with one in its first four bytes for UTF-16 and fail vaguely)
    400 json_too_deep           arrays and objects nested deeper than MAX_JSON_DEPTH: measured
                                without recursion, before the parser (which recurses once per
                                level) sees the body

An OpenAI request nests a few levels (a message's content parts are at depth 4); a JSON schema
in a request nests deeper, which is why the limit is serde_json's 128 and not lower.

This file imports only the standard library at import time (numpy is loaded by the first body
with more brackets than the limit), like guard.py, so `nanovllm serve --help` stays light.
"""

from __future__ import annotations

from email.message import Message

MAX_JSON_DEPTH = 128


class BodyError(ValueError):
    """A body refused before parsing: the HTTP status, OpenAI's `code`, the message."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


# Bodies under this size are left to the request models: validating them costs little.
LARGE_BODY_BYTES = 64 * 2**10
# Entries of one array or object in a request body at most (a body that has more is larger than
# LARGE_BODY_BYTES, so `check_items` sees every one): the work a body can cost the event loop
# stays bounded whatever it holds. The schema says it (`openapi.py`).
MAX_JSON_ITEMS = 65_536


def check_items(body: bytes, max_model_len: int) -> None:
    """Raise `BodyError` (400) when a large body holds an array or object of more than
    MAX_JSON_ITEMS entries, or a `prompt` of more token ids than `max_model_len`
    (`context_length_exceeded`), before anything parses it.

    Parsing and validating 400,000 token ids took 200 ms of the event loop (every stream waits
    for it: json and pydantic hold the GIL throughout, so a thread would not help); this scan
    counts them in a few ms, vectorised over the bytes. Small bodies are not scanned.
    """
    bound = min(MAX_JSON_ITEMS, max_model_len)
    if len(body) <= LARGE_BODY_BYTES or body.count(b",") < bound:
        return  # too few entries in the whole body to break either bound
    import numpy as np

    codes = np.frombuffer(body, dtype=np.uint8)
    depth, inside = _depths(codes, body)
    outside = ~inside
    opens = np.flatnonzero(outside & ((codes == ord("[")) | (codes == ord("{"))))
    commas = np.flatnonzero(outside & (codes == ord(",")))
    # Containers at one depth do not overlap, so each comma belongs to the last container
    # opened at its own depth before it: sort both by (depth, position) and search.
    span = len(codes) + 1
    open_keys = depth[opens].astype(np.int64) * span + opens
    order = np.argsort(open_keys)
    open_keys, opens = open_keys[order], opens[order]
    comma_keys = depth[commas].astype(np.int64) * span + commas
    owner = np.searchsorted(open_keys, comma_keys, side="right") - 1
    entries = np.bincount(owner, minlength=len(opens)) + 1  # [len(opens)]
    for index in np.flatnonzero(entries > bound):
        start, count = int(opens[index]), int(entries[index])
        field = _top_level_field(body, depth, inside, start)
        ids = (
            body[start : start + 1] == b"[" and body[start + 1 : start + 64].lstrip()[:1].isdigit()
        )
        if field == "prompt" and ids and count > max_model_len:  # (not a batch's list of prompts)
            raise BodyError(
                400,
                "context_length_exceeded",
                f"prompt of {count} tokens does not fit max_model_len={max_model_len} "
                "(refused before any other check)",
                "prompt",
            )
        if count > MAX_JSON_ITEMS:
            raise BodyError(
                400,
                "too_many_items",
                f"{field or 'the request body'} holds an array or object of {count} entries; "
                f"the server accepts at most {MAX_JSON_ITEMS} in one",
                field,
            )


def _depths(codes, body: bytes):
    """For each byte, how many arrays and objects enclose it (an opening bracket counts itself,
    a closing one does not), and whether it is inside a string."""
    import numpy as np

    quotes = codes == ord('"')
    if b"\\" in body:  # drop the escaped quotes
        index = np.arange(len(codes), dtype=np.int32)
        # For each byte, the index of the last byte at or before it that is not a backslash.
        not_backslash = np.maximum.accumulate(np.where(codes != ord("\\"), index, -1))
        backslashes_before = np.zeros(len(codes), dtype=np.int32)
        backslashes_before[1:] = index[:-1] - not_backslash[:-1]
        quotes &= backslashes_before % 2 == 0
    inside = np.bitwise_xor.accumulate(quotes.view(np.uint8)).view(bool)
    step_of_byte = np.zeros(256, dtype=np.int32)
    step_of_byte[[ord("["), ord("{")]] = 1
    step_of_byte[[ord("]"), ord("}")]] = -1
    steps = step_of_byte[codes]
    steps[inside] = 0
    depth = np.cumsum(steps)
    depth[steps == -1] += 1  # a closing bracket belongs to what it closes
    return depth, inside


def _top_level_field(body: bytes, depth, inside, position: int) -> str | None:
    """The name of the top-level field whose value holds the byte at `position` (None when the
    body is not an object, or the name cannot be read)."""
    import json
    import re

    import numpy as np

    colons = np.flatnonzero(
        (np.frombuffer(body[:position], dtype=np.uint8) == ord(":"))
        & ~inside[:position]
        & (depth[:position] == 1)
    )
    if not len(colons):
        return None
    match = re.search(rb'"((?:[^"\\]|\\.)*)"\s*$', body[: int(colons[-1])])
    try:
        return json.loads(b'"' + match.group(1) + b'"') if match else None
    except ValueError:
        return None


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not
    count). Vectorised over the bytes: linear time, no recursion, whatever the depth.

    A quote opens or closes a string unless an odd number of backslashes precede it; a byte
    is inside a string when an odd number of such quotes come before it (the opening quote
    included). Outside strings, each `[` or `{` is one level down and each `]` or `}` one up.
    """
    import numpy as np

    if not body:
        return 0
    depth, _ = _depths(np.frombuffer(body, dtype=np.uint8), body)
    return int(depth.max(initial=0))


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
    nul = body.find(b"\x00")
    if nul >= 0:  # never JSON; and in the first 4 bytes, Python's json would read it as UTF-16
        raise BodyError(
            400,
            "json_invalid",
            f"the request body is not valid JSON: a NUL byte at offset {nul} (control "
            "characters must be escaped inside strings)",
        )
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest deeper (the usual case: no need to measure)
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
            400,
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
            400,
            "unsupported_media_type",
            f"Content-Type {content_type!r} is not supported; send the JSON body with "
            "'Content-Type: application/json'",
        )
