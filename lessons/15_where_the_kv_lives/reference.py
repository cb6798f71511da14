"""Lesson 15 reference: the engine's own `HostBlockTier` (`nanovllm/kv_transfer/host_tier.py`),
unchanged."""

from __future__ import annotations

from nanovllm.kv_transfer.host_tier import HostBlockTier

__all__ = ["HostBlockTier"]
