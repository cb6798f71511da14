"""Lesson 03 reference: the engine's own `FreeBlockQueue`, unchanged."""

from __future__ import annotations

from nanovllm.core.free_block_queue import FreeBlockQueue

__all__ = ["FreeBlockQueue"]
