"""Lesson 16 reference: the engine's own `SlidingWindowManager`
(`nanovllm/core/sliding_window_manager.py`), unchanged."""

from __future__ import annotations

from nanovllm.core.sliding_window_manager import SlidingWindowManager

__all__ = ["SlidingWindowManager"]
