"""Prompt logprobs: each prompt token's log-probability given the tokens before it.

A request with `prompt_logprobs=n` needs the logits of its prompt positions, not only of its
last token: the row at position p scores prompt token p + 1 (the first prompt token has no
row, so its entry is None). Each step, the rows of the prompt positions the step computes for
such requests are appended after the sampling rows (`with_prompt_rows`), the model computes
their logits with the others', and `split_prompt_logprobs` takes them off again before the
sampler sees the batch: per request, (token index, {token id: (logprob, rank)}) with the prompt
token's own entry and the top n (-1: the whole vocabulary), from the raw distribution.

- Chunked prefill: each chunk brings the rows of its own positions; the output processor puts
  each entry at its token's index, so a chunk computed again after a preemption writes the same
  entries again.
- Prefix caching: such a request reads nothing from the cache (`kv_cache_manager.py`, vLLM's
  rule), since a cached token is never computed and its row would be missing. Its own blocks
  are still cached for later requests.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.step_inputs import StepInputs
from nanovllm.request import Request

# Per request id: (index of the prompt token, {token id: (logprob, rank)}) for each new entry.
PromptLogprobs = dict[str, list[tuple[int, dict[int, tuple[float, int]]]]]


def prompt_logprob_rows(out: SchedulerOutput) -> list[tuple[Request, int, int]]:
    """(request, flat row, position) for every prompt position this step computes for the
    requests that ask for prompt logprobs; position p scores prompt token p + 1."""
    rows = []
    offset = 0  # the request's first row in the step's flat batch (as `step_inputs` lays it)
    for s in out.scheduled:
        request = s.request
        if request.sampling_params.prompt_logprobs is not None:
            start = s.num_computed_tokens
            end = min(start + s.num_new_tokens, request.num_prompt_tokens - 1)
            rows.extend((request, offset + p - start, p) for p in range(start, end))
        offset += s.num_new_tokens
    return rows


def with_prompt_rows(inputs: StepInputs, out: SchedulerOutput) -> StepInputs:
    """The step's inputs with the prompt-logprob rows after the sampling rows (the same inputs
    when no request of the step asks)."""
    rows = prompt_logprob_rows(out)
    if not rows:
        return inputs
    input_ids, positions, meta, logits_rows = inputs
    extra = [row for _, row, _ in rows]
    if isinstance(logits_rows, torch.Tensor):
        extra_t = torch.tensor(extra, dtype=logits_rows.dtype, device=logits_rows.device)
        return input_ids, positions, meta, torch.cat([logits_rows, extra_t])
    return input_ids, positions, meta, [*logits_rows, *extra]


def split_prompt_logprobs(
    logits: torch.Tensor | None,  # [num_sampling_rows + num_prompt_rows, vocab]
    out: SchedulerOutput,
) -> tuple[torch.Tensor | None, PromptLogprobs]:
    """The sampling rows' logits, and the prompt logprob entries of the rows after them."""
    rows = prompt_logprob_rows(out)
    if not rows or logits is None:
        return logits, {}
    num = len(rows)
    logprobs = logits[-num:].float().log_softmax(dim=-1)  # [num, vocab]
    vocab = logprobs.shape[-1]
    targets = [request.prompt_token_ids[p + 1] for request, _, p in rows]
    chosen = logprobs.gather(1, torch.tensor(targets, device=logprobs.device)[:, None])
    ranks = (logprobs >= chosen).sum(dim=-1).tolist()  # [num]
    chosen_list = chosen[:, 0].tolist()
    n_max = max(_top_n(request, vocab) for request, _, _ in rows)
    top = logprobs.topk(n_max) if n_max else None
    result: PromptLogprobs = defaultdict(list)
    for j, (request, _, p) in enumerate(rows):
        n = _top_n(request, vocab)
        entry: dict[int, tuple[float, int]] = {}
        if top is not None and n:
            ids, values = top.indices[j, :n].tolist(), top.values[j, :n].tolist()
            entry = {t: (v, rank) for rank, (t, v) in enumerate(zip(ids, values), start=1)}
        entry[targets[j]] = (chosen_list[j], ranks[j])
        result[request.request_id].append((p + 1, entry))
    return logits[:-num], dict(result)


def _top_n(request: Request, vocab: int) -> int:
    n = request.sampling_params.prompt_logprobs
    assert n is not None
    return vocab if n == -1 else n
