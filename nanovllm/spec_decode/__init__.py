"""Speculative decoding: propose several next tokens cheaply, verify them in one forward pass.

- `nanovllm/speculative_config.py`: `speculative_config`, vLLM's shape, checked once.
- `ngram_proposer.py`: proposals from the request's own earlier tokens (prompt lookup).
- `draft_model_proposer.py`: proposals from a smaller model with the same vocabulary, which keeps
  its own KV cache in the target's blocks.
- `propose.py`: which requests get proposals each step, and how many tokens each.
- `nanovllm/executor/rejection_sampler.py`: the verification rule that keeps the target model's
  distribution (part of sampling).
- `metrics.py`: `SpecDecodingStats`, vLLM's counters of what was proposed and accepted.
"""
