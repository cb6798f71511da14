"""The KV secret: who may join a disaggregated deployment's KV link, and name a transfer.

A KV link's port must be reachable by the other engine, which may be on another machine, so
"listen on loopback" alone cannot protect it. The engines prove instead that they hold one
shared secret, and a client that does not hold it is turned away:

- the KV link (`p2p_transport.py`): whoever connects to the consumer's port must first answer
  a fresh challenge (HMAC-SHA256), and both ends answer each other's; only then is a rendezvous
  store formed, private to the two of them, so a client without the secret finds no store,
  no key, and nothing to write;
- the servers (`serve/serving.py`): a request's `kv_transfer_params` count only when the proxy
  signed its transfer id with the secret (`sign`); anything else is refused (403), so no client
  can make the decode server hold a request for a transfer that will never come. A prefill
  request's signature covers its deadline too (`deadline_ms`): read after the proxy gave up
  (a stopped server resumed), it is refused before the engine computes it.

Where the secret comes from, first found first:

    kv_connector_extra_config["secret"]     the flag (in --kv-transfer-config's JSON)
    $NANOVLLM_KV_SECRET                     the environment (the proxy reads it too)
    $NANOVLLM_HOME/kv_secret                made on first use (random, mode 0600)

The last makes a deployment on one machine safe with no setting at all, as Erlang's
~/.erlang.cookie does: every engine and proxy that the same user starts reads the same file.
On two machines, set $NANOVLLM_KV_SECRET to the same value on both (or copy the file).
The secret authenticates; it does not encrypt: the KV itself crosses in the clear.

(This module imports no torch: the proxy, which loads no model, uses it.)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

SECRET_ENV = "NANOVLLM_KV_SECRET"
HOME_ENV = "NANOVLLM_HOME"
SECRET_FILE = "kv_secret"


def secret_file() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".nanovllm") / SECRET_FILE


def kv_secret(configured: str | None = None) -> str:
    """The KV secret (see the module docstring for where it comes from)."""
    if configured:
        return configured
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    path = secret_file()
    if not path.exists():
        _create(path)
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ValueError(f"the KV secret file {path} is empty: delete it to have a new one made")
    return value


def secret_source(configured: str | None = None) -> str:
    """Where `kv_secret(configured)` finds the secret, in words (for the start-up warning)."""
    if configured:
        return 'kv_connector_extra_config["secret"]'
    if os.environ.get(SECRET_ENV):
        return f"${SECRET_ENV}"
    return f"{secret_file()} (copy it to the other machine, or set ${SECRET_ENV} on both)"


def _create(path: Path) -> None:
    """Write a fresh secret to `path`, atomically: two engines started at once both read the
    one that was linked first (a half-written file is never visible)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    try:
        os.link(temporary, path)  # fails if another process made it first: theirs is used
    except FileExistsError:
        pass
    finally:
        temporary.unlink()


def sign(secret: str, purpose: str, message: bytes) -> bytes:
    """HMAC-SHA256 of `message` under the secret, for one `purpose` (a signature made for one
    use is never valid for another)."""
    return hmac.new(secret.encode(), purpose.encode() + b"\0" + message, hashlib.sha256).digest()


def transfer_signature(secret: str, transfer_id: str, deadline_ms: int | None = None) -> str:
    """What the proxy adds to `kv_transfer_params` (as "signature") to name a transfer; with
    `deadline_ms` (the prefill request's), the deadline is signed with it."""
    message = transfer_id if deadline_ms is None else f"{transfer_id}@{deadline_ms}"
    return sign(secret, "transfer", message.encode()).hex()


def check_transfer_params(secret: str, params: dict, now_ms: int | None = None) -> str | None:
    """None if `params` (a request's `kv_transfer_params`) carry a valid signature of their
    transfer id (and of their `deadline_ms`, when they have one) and that deadline has not
    passed (`now_ms`: the clock, milliseconds since the epoch), else why not (for a 403 naming
    the field). A prefill request past its deadline is one the proxy has given up on (a
    prefill server that was stopped reads it late): refused before the engine sees it."""
    transfer_id, signature = params.get("transfer_id"), params.get("signature")
    deadline_ms = params.get("deadline_ms")
    if not isinstance(transfer_id, str) or not isinstance(signature, str):
        return (
            "kv_transfer_params are accepted only from the disaggregated proxy (a transfer_id "
            "and its signature with the KV secret); a client sends none"
        )
    if deadline_ms is not None and type(deadline_ms) is not int:
        return f"kv_transfer_params' deadline_ms must be an integer, got {deadline_ms!r}"
    if not hmac.compare_digest(signature, transfer_signature(secret, transfer_id, deadline_ms)):
        return (
            "kv_transfer_params' signature does not match this server's KV secret "
            f"(${SECRET_ENV}): only the disaggregated proxy may name a transfer"
        )
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if deadline_ms is not None and now_ms > deadline_ms:
        return (
            f"kv_transfer_params' deadline_ms passed {now_ms - deadline_ms} ms ago: the proxy "
            "has given up on this prefill (or this machine's clock is ahead of the proxy's)"
        )
    return None
