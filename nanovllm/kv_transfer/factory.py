"""The KV connectors by name, as `kv_transfer_config["kv_connector"]` names them."""

from __future__ import annotations

from collections.abc import Callable

from nanovllm.events import EventBus
from nanovllm.kv_transfer.base import KVConnectorBase, KVConnectorRole
from nanovllm.kv_transfer.offloading import OffloadingConnector
from nanovllm.kv_transfer.p2p import P2pConnector
from nanovllm.kv_transfer.shared_storage import SharedStorageConnector
from nanovllm.kv_transfer_config import KVTransferConfig

CONNECTORS: dict[str, type[KVConnectorBase]] = {
    cls.name: cls for cls in (OffloadingConnector, SharedStorageConnector, P2pConnector)
}


def check_connector(config: KVTransferConfig) -> None:
    """ValueError naming an unknown connector, a role it cannot play, or a bad extra config."""
    cls = CONNECTORS.get(config.kv_connector)
    if cls is None:
        raise ValueError(
            f"unknown kv_connector {config.kv_connector!r}; nanovllm has {sorted(CONNECTORS)}"
        )
    cls.check_config(config)


def checked_config(data: dict) -> KVTransferConfig:
    """A `kv_transfer_config` dict checked through and through: its shape, then the connector."""
    config = KVTransferConfig.from_dict(data)
    check_connector(config)
    return config


def create_connector(
    config: KVTransferConfig,
    role: KVConnectorRole,
    block_size: int,
    model_tag: str,
    events: EventBus | None = None,
    host_tier_cls: Callable[[int], object] | None = None,
) -> KVConnectorBase:
    """One side (`role`) of the configured connector; `host_tier_cls`: the class of its host
    tier (`engine/parts.py`), for a connector that keeps one (None: its own)."""
    check_connector(config)
    cls = CONNECTORS[config.kv_connector]
    if host_tier_cls is None:
        return cls(config, role, block_size, model_tag, events)
    if not getattr(cls, "keeps_a_host_tier", False):
        raise ValueError(
            f"a host tier class was given, but the {config.kv_connector} keeps no host tier "
            "(the OffloadingConnector does)"
        )
    return cls(config, role, block_size, model_tag, events, host_tier_cls=host_tier_cls)
