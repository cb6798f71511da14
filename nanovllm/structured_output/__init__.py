"""Structured outputs: the output is constrained to a language (a JSON Schema, a regex, a
choice of strings, an EBNF grammar) by a per-step mask over the vocabulary.

- `params.py`: `StructuredOutputsParams`, vLLM's request-side class.
- `backend_xgrammar.py`: compiling a constraint, and the per-request matcher (xgrammar).
- `manager.py`: the engine's side: compile at arrival, the step's bitmask, advancing and ending.
- `bitmask.py`: applying a bitmask to the logits rows before sampling.
"""

from nanovllm.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
