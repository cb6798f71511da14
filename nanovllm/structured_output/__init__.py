"""Structured outputs: the output is constrained to a language (a JSON Schema, a regex, a
choice of strings, an EBNF grammar) by a per-step mask over the vocabulary.

The request's side is `StructuredOutputsParams` (`nanovllm/sampling_params.py`, where vLLM has
it). The engine's side:

- `backend_xgrammar.py`: compiling a constraint, and the per-request matcher (xgrammar).
- `manager.py`: compile at arrival, the step's bitmask, advancing and ending the request.
- `bitmask.py`: applying a bitmask to the logits rows before sampling.
"""
