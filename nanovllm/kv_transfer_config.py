"""KVTransferConfig: which KV connector the engine runs, in what role, with what settings.

vLLM's shape, so the same dict works there:

    LLM(model, kv_transfer_config={
        "kv_connector": "OffloadingConnector",          # or "SharedStorageConnector"
        "kv_role": "kv_both",                           # "kv_producer" | "kv_consumer" | "kv_both"
        "kv_connector_extra_config": {"num_cpu_blocks": 256},
    })

A producer saves KV for others, a consumer loads KV that others saved, `kv_both` does both.
A connector that talks to another engine over the network (`P2pConnector`) also takes vLLM's
`kv_ip` and `kv_port`: where the consumer listens and the producer connects.
This module checks the dict's shape; each connector then says which roles it can play and
checks its own extra config (`kv_transfer/factory.py`, when the engine is set up). A bad value
is a ValueError that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class KVTransferConfig:
    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_ip: str = "127.0.0.1"
    kv_port: int | None = None

    @property
    def is_producer(self) -> bool:
        """Whether this engine saves KV (for another engine, or for later)."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """Whether this engine loads KV instead of computing it."""
        return self.kv_role in ("kv_consumer", "kv_both")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVTransferConfig:
        """Check a `kv_transfer_config` dict's keys and role, and build the config."""
        if not isinstance(data, dict):
            raise ValueError(f"kv_transfer_config must be a dict, got {data!r}")
        known = {"kv_connector", "kv_role", "kv_connector_extra_config", "kv_ip", "kv_port"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"kv_transfer_config has unknown keys {unknown}; it takes {sorted(known)}"
            )
        name = data.get("kv_connector")
        if not isinstance(name, str):
            raise ValueError(f"kv_transfer_config needs 'kv_connector' (a name), got {name!r}")
        role = data.get("kv_role", "kv_both")
        if role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {list(KV_ROLES)}, got {role!r}")
        extra = data.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"kv_connector_extra_config must be a dict, got {extra!r}")
        ip = data.get("kv_ip", "127.0.0.1")
        if not isinstance(ip, str) or not ip:
            raise ValueError(f"kv_ip must be a host name or address, got {ip!r}")
        port = data.get("kv_port")
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        ):
            raise ValueError(f"kv_port must be an int in [1, 65535], got {port!r}")
        return cls(name, role, dict(extra), ip, port)
