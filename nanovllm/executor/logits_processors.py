"""Logits processors: what a request's `SamplingParams` do to its logits before temperature.

The sampler calls `apply_logits_processors` first, on the raw logits, so greedy requests see
them too (the argmax is taken after them). In vLLM v1's order, each over the rows of the
requests that use it, all at once, and skipped when no request of the step does:

1. `allowed_token_ids`: every other token -> -inf;
2. `bad_words`: a bad word's last token -> -inf where the output so far ends with the tokens
   before it (a one-token bad word always);
3. `min_tokens`: while fewer than `min_tokens` tokens are out, the stop tokens (EOS unless
   `ignore_eos`, and `stop_token_ids`) -> -inf;
4. `logit_bias`: logits[t] += bias[t];
5. penalties, with c[t] the count of token t in the output so far and P the prompt's tokens:
   - repetition (transformers' and vLLM's): for t in P or c[t] > 0,
     logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r;
   - frequency and presence (OpenAI's): logits[t] -= c[t] * f + (c[t] > 0) * p.

"The output so far" is per row: with speculative decoding a request has 1 + k rows, and row j
scores the token after its j-th proposal, so its output is the request's output plus its first
j proposed tokens (as vLLM counts them).

When no request of the step uses any of them, the logits come back as they are (the same
tensor); otherwise a copy, since the logprobs are those of the raw logits.
"""

from __future__ import annotations

import weakref

import torch

from nanovllm.request import Request

# A request's prompt as a [vocab] bool mask, made on first use and dropped with the request.
_prompt_masks: weakref.WeakKeyDictionary[Request, torch.Tensor] = weakref.WeakKeyDictionary()


def apply_logits_processors(
    logits: torch.Tensor,  # [num_rows, vocab]
    requests: list[Request],
    spec_token_ids: list[list[int]] | None = None,
) -> torch.Tensor:  # [num_rows, vocab]
    """`logits` with every request's processors applied (the same tensor when none has any)."""
    if not any(r.sampling_params.uses_logits_processors for r in requests):
        return logits
    spec = spec_token_ids or [[] for _ in requests]
    # One entry per row: (its request, the output tokens before the token this row scores).
    rows: list[tuple[Request, list[int]]] = []
    for request, proposed in zip(requests, spec):
        for j in range(1 + len(proposed)):
            rows.append((request, request.output_token_ids + proposed[:j]))
    logits = logits.clone()
    neg_inf = float("-inf")
    _apply_allowed_token_ids(logits, rows)
    banned: list[tuple[int, int]] = []  # (row, token) pairs -> -inf
    for i, (request, output) in enumerate(rows):
        banned.extend((i, token) for token in _bad_word_tokens(request, output))
        if len(output) < request.sampling_params.min_tokens:
            banned.extend((i, token) for token in _stop_tokens(request))
    if banned:
        row_ids, token_ids = zip(*banned)
        logits[list(row_ids), list(token_ids)] = neg_inf
    _apply_logit_bias(logits, rows)
    _apply_penalties(logits, rows)
    return logits


def _apply_allowed_token_ids(logits: torch.Tensor, rows: list[tuple[Request, list[int]]]) -> None:
    """Mask, in place, every token outside a row's `allowed_token_ids`."""
    using = [i for i, (r, _) in enumerate(rows) if r.sampling_params.allowed_token_ids is not None]
    if not using:
        return
    allowed = torch.zeros(len(using), logits.shape[-1], dtype=torch.bool)  # [n, vocab]
    for j, i in enumerate(using):
        allowed[j, rows[i][0].sampling_params.allowed_token_ids] = True
    index = torch.tensor(using, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))


def _bad_word_tokens(request: Request, output: list[int]) -> list[int]:
    """The tokens `bad_words` bans after `output`: each bad word's last token, where `output`
    ends with the bad word's other tokens."""
    banned = []
    for word in request.sampling_params.bad_words_token_ids:
        prefix = word[:-1]
        if not prefix or output[len(output) - len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


def _stop_tokens(request: Request) -> list[int]:
    """The tokens that would end the request: EOS (unless `ignore_eos`) and `stop_token_ids`."""
    params = request.sampling_params
    eos = [] if params.ignore_eos else sorted(request.eos_token_ids)
    return eos + list(params.stop_token_ids)


def _apply_logit_bias(logits: torch.Tensor, rows: list[tuple[Request, list[int]]]) -> None:
    """Add, in place, each row's `logit_bias` to its logits."""
    row_ids, token_ids, biases = [], [], []
    for i, (request, _) in enumerate(rows):
        for token, bias in (request.sampling_params.logit_bias or {}).items():
            row_ids.append(i)
            token_ids.append(token)
            biases.append(bias)
    if row_ids:
        bias_t = torch.tensor(biases, dtype=logits.dtype, device=logits.device)
        logits[row_ids, token_ids] += bias_t  # (a request's keys are distinct: no repeats)


def _apply_penalties(logits: torch.Tensor, rows: list[tuple[Request, list[int]]]) -> None:
    """Apply, in place, the repetition, frequency and presence penalties of the rows that have
    any."""
    using = [
        i
        for i, (r, _) in enumerate(rows)
        if r.sampling_params.repetition_penalty != 1
        or r.sampling_params.frequency_penalty
        or r.sampling_params.presence_penalty
    ]
    if not using:
        return
    device, vocab = logits.device, logits.shape[-1]
    params = [rows[i][0].sampling_params for i in using]
    counts = output_token_counts([rows[i][1] for i in using], vocab, device)  # [n, vocab]
    seen = counts > 0  # [n, vocab]
    index = torch.tensor(using, device=device)
    scores = logits[index]  # [n, vocab]
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    if (repetition != 1).any():
        prompt = torch.stack([prompt_mask(rows[i][0], vocab, device) for i in using])
        penalty = torch.where(prompt | seen, repetition, 1.0)  # [n, vocab]
        scores = torch.where(scores > 0, scores / penalty, scores * penalty)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    scores = scores - frequency * counts - presence * seen
    logits[index] = scores


def output_token_counts(outputs: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(outputs), vocab] float: how many times each token occurs in each output."""
    longest = max(map(len, outputs))
    # Pad with `vocab`, one column past the vocabulary, then drop that column.
    padded = torch.full((len(outputs), longest), vocab, dtype=torch.long)
    for i, output in enumerate(outputs):
        padded[i, : len(output)] = torch.tensor(output, dtype=torch.long)
    counts = torch.zeros(len(outputs), vocab + 1, device=device)
    counts.scatter_add_(1, padded.to(device), torch.ones(padded.shape, device=device))
    return counts[:, :vocab]


def prompt_mask(request: Request, vocab: int, device: torch.device) -> torch.Tensor:
    """[vocab] bool: the tokens of the request's prompt (made once per request and device)."""
    mask = _prompt_masks.get(request)
    if mask is None or mask.device != device or mask.shape[0] != vocab:
        mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        mask[torch.tensor(request.prompt_token_ids, device=device)] = True
        _prompt_masks[request] = mask
    return mask
