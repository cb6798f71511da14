"""Driving an engine through injected faults: step until every request is done, counting the
steps that raised, and keeping each request's final output."""

from __future__ import annotations

from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.outputs import RequestOutput


def run_through_faults(engine: LLMEngine) -> tuple[dict[str, RequestOutput], int]:
    """(request id -> its final output, how many steps raised a RuntimeError)."""
    final: dict[str, RequestOutput] = {}
    failures = 0
    while engine.has_unfinished_requests():
        try:
            outputs = engine.step()
        except RuntimeError:
            failures += 1
            continue
        final.update({o.request_id: o for o in outputs if o.finished})
    return final, failures
