"""Parallel sampling: one prompt, n completions (`SamplingParams(n=k)`), the way vLLM does it.

The engine fans a request with n > 1 out into n *child* requests, which the scheduler treats as
ordinary requests. Child i has the id f"{i}_{parent_id}" (vLLM's naming) and the parent's
sampling parameters with n = 1 and, when the parent has a seed, seed + i: the children draw
differently from each other, and each is reproducible on its own.

The children's prompts are the same tokens, so the prefix cache shares their full blocks by
reference count: child 0 computes them, and each later child finds them cached and computes only
its prompt's last, partial block and its own output. No extra rule is needed for that. The
children queue right behind child 0, and the scheduler admits in order: while child 0 is still
prefilling, its chunk takes the whole remaining token budget, so a later child is admitted only
in the step that schedules the end of child 0's prompt, or after. A child admitted in that same
step still shares, because blocks enter the prefix cache when scheduled and the forward pass
writes all new K/V before any attention reads the cache (`tests/test_parallel_sampling.py`
checks that each later child computed only its tail). With prefix caching off there is nothing
to share through, and each child computes the whole prompt.

What the caller sees is the parent: one `RequestOutput` per step with progress, whose `outputs[i]`
is child i's completion so far (with `index = i`), finished when every child is (with
`FINAL_ONLY` outputs, only that last one). Aborting the parent aborts every child; preempting
one child frees and later recomputes that child alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nanovllm.engine.outputs import CompletionOutput, RequestOutput
from nanovllm.request import Request
from nanovllm.sampling_params import RequestOutputKind, SamplingParams


def child_request_id(parent_id: str, index: int) -> str:
    return f"{index}_{parent_id}"


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index`'s parameters: the parent's, with n = 1 and its own seed."""
    seed = None if params.seed is None else (params.seed + index) % 2**63
    return dataclasses.replace(params, n=1, seed=seed)


@dataclass
class ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    # The latest completion of each child, in index order (empty until it produces output).
    completions: list[CompletionOutput] = field(default_factory=list)
    # With `prompt_logprobs`: the prompt's entries (the children's are the same), once known.
    prompt_logprobs: list | None = None

    def __post_init__(self) -> None:
        self.completions = [
            CompletionOutput(index=i, text="", token_ids=[], logprobs=self._no_logprobs())
            for i in range(len(self.children))
        ]

    @property
    def finished(self) -> bool:
        return all(child.is_finished for child in self.children)

    @property
    def output_kind(self) -> RequestOutputKind:
        return self.children[0].sampling_params.output_kind

    def _no_logprobs(self) -> list | None:
        """An empty completion's logprobs: [] when they were asked for, else None."""
        return None if self.children[0].sampling_params.logprobs is None else []

    def output(self) -> RequestOutput:
        """The parent as the caller sees it: every child's completion so far.

        Each completion's `delta_text` is what that child added since the previous output of
        the parent (empty for children that did not move). With `DELTA` outputs, the text and
        token ids are that delta too: a child that did not move has an empty completion.
        """
        errors = [c.error for c in self.children if c.error]
        output = RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=list(self.completions),
            finished=self.finished,
            num_cached_tokens=self.children[0].num_cached_tokens,
            prompt_logprobs=self.prompt_logprobs,
            error="; ".join(errors) if errors else None,
        )
        moved = {"delta_text": "", "delta_token_ids": []}
        if self.output_kind == RequestOutputKind.DELTA:
            moved.update(text="", token_ids=[], logprobs=self._no_logprobs())
        self.completions = [dataclasses.replace(c, **moved) for c in self.completions]
        return output
