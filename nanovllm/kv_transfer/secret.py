"""The KV secret: who may join a disaggregated deployment's KV link, and name a transfer.

A KV link's port must be reachable by the other engine, which may be on another machine, so
"listen on loopback" alone cannot protect it. The engines prove instead that they hold one
shared secret, and a client that does not hold it is turned away:

- the KV link (`p2p_transport.py`): every key of the consumer's rendezvous store lives under a
  name derived from the secret (`store_prefix`), so a client without it finds nothing there;
  then both ends answer each other's fresh challenge (HMAC-SHA256) before any KV crosses;
- the servers (`serve/serving.py`): a request's `kv_transfer_params` count only when the proxy
  signed its transfer id with the secret (`sign`); anything else is refused (403), so no client
  can make the decode server hold a request for a transfer that will never come.

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


def store_prefix(secret: str) -> str:
    """The rendezvous store's namespace: known only to who holds the secret."""
    return sign(secret, "store", b"").hex()[:32] + "/"


def transfer_signature(secret: str, transfer_id: str) -> str:
    """What the proxy adds to `kv_transfer_params` (as "signature") to name a transfer."""
    return sign(secret, "transfer", transfer_id.encode()).hex()


def check_transfer_params(secret: str, params: dict) -> str | None:
    """None if `params` (a request's `kv_transfer_params`) carry a valid signature of their
    transfer id, else why not (for a 403 naming the field)."""
    transfer_id, signature = params.get("transfer_id"), params.get("signature")
    if not isinstance(transfer_id, str) or not isinstance(signature, str):
        return (
            "kv_transfer_params are accepted only from the disaggregated proxy (a transfer_id "
            "and its signature with the KV secret); a client sends none"
        )
    if not hmac.compare_digest(signature, transfer_signature(secret, transfer_id)):
        return (
            "kv_transfer_params' signature does not match this server's KV secret "
            f"(${SECRET_ENV}): only the disaggregated proxy may name a transfer"
        )
    return None
