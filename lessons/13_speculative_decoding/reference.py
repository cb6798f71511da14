"""Lesson 13 reference: the engine's verification rules, `nanovllm/executor/rejection_sampler.py`,
exactly as the engine's sampler calls them."""

from __future__ import annotations

from nanovllm.executor.rejection_sampler import verify_greedy, verify_random

__all__ = ["verify_greedy", "verify_random"]
