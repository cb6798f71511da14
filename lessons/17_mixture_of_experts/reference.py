"""Lesson 17 reference: the engine's own router rule and token dispatch (`nanovllm/models/moe.py`:
`select_experts`, `sort_by_expert`, `fused_experts`), unchanged."""

from __future__ import annotations

from nanovllm.models.moe import fused_experts, select_experts, sort_by_expert

__all__ = ["select_experts", "sort_by_expert", "fused_experts"]
