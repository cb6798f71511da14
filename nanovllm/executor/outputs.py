"""What executing a step returns: the sampler's results, and the model runner's by request id.

The sampler is given the step's sampling requests as a list, so its results are lists in that
order (`SamplerOutput`); the model runner's are keyed by request id (`ModelRunnerOutput`, which
`add_sampled` fills from the sampler's), the form the scheduler and the engine read. vLLM keeps
both in its own `v1/outputs.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanovllm.executor.logprobs import SampleLogprobs
from nanovllm.executor.prompt_logprobs import PromptLogprobs


@dataclass
class SamplerOutput:
    token_ids: list[list[int]]  # per request: its new tokens (1, or 1 to k + 1 when verifying)
    logprobs: SampleLogprobs  # per request and new token, when asked for
    errors: dict[int, str] = field(default_factory=dict)  # request -> why it could not sample


@dataclass
class ModelRunnerOutput:
    """One step's results, by request id."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)  # 1 to k + 1 each
    logprobs: dict[str, list[dict[int, tuple[float, int]]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # requests that could not be sampled
    prompt_logprobs: PromptLogprobs = field(default_factory=dict)  # `prompt_logprobs.py`

    def add_sampled(self, request_ids: list[str], sampled: SamplerOutput) -> None:
        """The sampler's results for `request_ids` (its i-th request is `request_ids[i]`): each
        one's new tokens and logprobs, or why it could not sample."""
        for i, rid in enumerate(request_ids):
            if i in sampled.errors:
                self.errors[rid] = sampled.errors[i]
                continue
            self.sampled_token_ids[rid] = sampled.token_ids[i]
            if sampled.logprobs[i] is not None:
                self.logprobs[rid] = sampled.logprobs[i]
