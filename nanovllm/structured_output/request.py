"""StructuredOutputRequest: what a structured request carries, its constraint and its matcher.

A `Request` holds one (`Request.structured_output_request`) when its params ask for structured
outputs; the manager (`manager.py`) makes it at arrival, installs its matcher once the grammar
has compiled, and reads it every step. It lives apart from the manager so that `request.py` can
name its type without importing the manager, which imports `request.py`.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from nanovllm.sampling_params import StructuredOutputsParams
from nanovllm.structured_output.backend_xgrammar import Grammar


@dataclass
class StructuredOutputRequest:
    """A request's constraint and its own matcher (`Request.structured_output_request`).

    `grammar` is None while the compiled grammar is on its way (`compiled`, from the compile
    thread): the scheduler does not schedule the request until `grammar_ready` sets it."""

    params: StructuredOutputsParams
    compiled: Future
    submitted_at: float = field(default_factory=time.monotonic)
    grammar: Grammar | None = None
