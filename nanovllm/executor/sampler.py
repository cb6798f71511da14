"""Sampler: from one row of logits per request to one token per request.

Each request brings its own `SamplingParams`, so one batch mixes greedy and random requests with
different temperatures and filters. The filters run on the whole batch at once, with per-row
parameters, in vLLM v1's order and with its meanings:

1. temperature: logits / temperature. A temperature below 1e-5 means greedy: argmax of the raw
   logits, no randomness at all (vLLM's rule; a tinier divisor would overflow to infinity);
2. min-p: drop tokens less likely than min_p x the most likely one;
3. top-k: keep the tokens whose logit is at least the k-th largest (tokens tied with the k-th
   are all kept, so a row can keep more than k);
4. top-p: keep the most likely tokens until their probability (renormalised after the filters
   above) reaches p; the most likely token is always kept.

Drawing a token (`random_draw.py`, not `torch.multinomial`): the draw vLLM uses on the same
device, so a seeded request draws vLLM's tokens (a CPU: Gumbel-max with hashed noise; a GPU: the
exponential race). Each row's noise comes from its request's own `torch.Generator`, which
advances only when that request samples (`generator_for`, beside the draws).

A row with no token to draw (NaN logits from a broken model or an overflow, or every token
masked by the request's own params) fails alone: the sampler reports it in `errors`, the engine
finishes that request with an error, and the other rows of the batch are sampled as usual.

Before all this, `logits_processors.py` applies what a request's params ask of its logits
(penalties, bias, banned and allowed tokens); logprobs are those of the raw logits (`logprobs.py`).
A request with k extra tokens (computed after its own: speculative decoding's proposals,
`core/extra_tokens.py`) has 1 + k rows, which the `verifier` turns into its new tokens
(`rejection_sampler.py`). The fast paths are `backends/sampler.py`'s.
"""

from __future__ import annotations

import itertools

import torch

from nanovllm.executor.logits_processors import apply_logits_processors
from nanovllm.executor.logprobs import sampled_logprobs
from nanovllm.executor.outputs import SamplerOutput
from nanovllm.executor.random_draw import Draw, exponential_race, generator_for
from nanovllm.executor.rejection_sampler import RejectionVerifier
from nanovllm.request import Request


def apply_filters(
    logits: torch.Tensor,  # [n, vocab] already divided by temperature
    top_k: torch.Tensor,  # [n] int, vocab size = disabled
    top_p: torch.Tensor,  # [n] float, 1.0 = disabled
    min_p: torch.Tensor,  # [n] float, 0.0 = disabled
) -> torch.Tensor:
    """Mask (to -inf) the tokens that min-p, top-k and top-p rule out, row by row."""
    neg_inf = float("-inf")
    # min-p, on the full distribution: relative to the most likely token.
    probs = logits.softmax(dim=-1)
    logits = logits.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), neg_inf)
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    # top-k: everything below the k-th largest logit goes; ties with it stay.
    kth = sorted_logits.gather(1, (top_k.long() - 1)[:, None])  # [n, 1]
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
    # top-p: drop a token when the tokens ranked above it already reach p (the first never is).
    # (top_p = 1 keeps everything: a float cumsum can reach 1.0 early, so skip those rows.)
    probs = sorted_logits.softmax(dim=-1)
    drop = ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(drop, neg_inf)
    return torch.full_like(logits, neg_inf).scatter(-1, sorted_ids, sorted_logits)


def greedy_tokens(logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Each row's argmax (the first index of a tied maximum) and whether the row has no token
    to give, a NaN or every token masked to -inf: ([num_rows] ints, [num_rows] bool).

    `logits.max(dim=-1)` propagates NaN, so a row's maximum is NaN exactly when the row holds
    one. (`backends/sampler.py` gives the same faster on a CPU, with numpy.)
    """
    best, argmax_t = logits.max(dim=-1)  # [num_rows] each
    return argmax_t.tolist(), torch.isnan(best) | (best == float("-inf"))


class Sampler:
    """`filters` is the function that applies min-p, top-k and top-p to a batch (`apply_filters`;
    the lessons swap in the learner's); `draw` picks a token from each filtered row; `verifier`
    turns the rows of a request with extra tokens into its new tokens."""

    def __init__(self, filters=apply_filters, draw: Draw = exponential_race, verifier=None) -> None:
        self.filters = filters
        self.draw = draw
        self.verifier = verifier or RejectionVerifier()

    greedy_tokens = staticmethod(greedy_tokens)  # (a fast sampler gives its own)

    def __call__(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        extra: list[list[int]] | None = None,
    ) -> SamplerOutput:
        """logits: [num_rows, vocab] fp32. Each request has one row, or 1 + k rows when it has k
        extra tokens: its last own token's, then one per extra token."""
        raw, logits = logits, apply_logits_processors(logits, requests, extra)
        # One pass gives both the greedy tokens (greedy rows are done) and the rows with a NaN.
        argmax, bad = self.greedy_tokens(logits)  # [num_rows] each
        device = logits.device
        extra = extra or [[] for _ in requests]
        counts = [1 + len(tokens) for tokens in extra]
        starts = [0, *itertools.accumulate(counts)][:-1]  # each request's first row
        random = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        probs: dict[int, torch.Tensor] = {}  # request -> its rows' processed distributions
        first_row: dict[int, int] = {}  # request -> its first row in `filtered`
        if random:
            rows = [row for i in random for row in range(starts[i], starts[i] + counts[i])]
            params = [requests[i].sampling_params for i in random for _ in range(counts[i])]
            vocab = logits.shape[-1]
            temperature = torch.tensor([p.temperature for p in params], device=device)
            top_k = torch.tensor(
                [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=device
            )
            top_p = torch.tensor([p.top_p for p in params], device=device)
            min_p = torch.tensor([p.min_p for p in params], device=device)
            rows_t = torch.tensor(rows, device=device)
            filtered = self.filters(logits[rows_t] / temperature[:, None], top_k, top_p, min_p)
            random_probs = filtered.softmax(dim=-1)  # [num_random_rows, vocab]
            bad[rows_t] |= torch.isnan(random_probs).any(dim=-1)
            offset = 0
            for i in random:
                probs[i] = random_probs[offset : offset + counts[i]]
                first_row[i] = offset
                offset += counts[i]
        bad_rows = set(torch.nonzero(bad).flatten().tolist()) if bad.any() else set()

        token_ids: list[list[int]] = [[] for _ in requests]
        errors: dict[int, str] = {}
        plain_random = []  # random requests with one row: drawn together below
        for i, request in enumerate(requests):
            if bad_rows and bad_rows.intersection(range(starts[i], starts[i] + counts[i])):
                errors[i] = (
                    f"request {request.request_id!r}: no next token can be drawn (NaN in the "
                    f"logits or probabilities at temperature={request.sampling_params.temperature!r}"
                    ", or every token masked); the request was stopped"
                )
            elif i not in probs:
                rows = argmax[starts[i] : starts[i] + counts[i]]
                token_ids[i] = self.verifier.greedy(rows, extra[i]) if extra[i] else rows
            elif extra[i]:
                generator = generator_for(request, device)
                token_ids[i] = self.verifier.random(probs[i], extra[i], generator)
            else:
                plain_random.append(i)
        if plain_random:
            # One draw for every row at once, each with its request's own noise.
            at = torch.tensor([first_row[i] for i in plain_random], device=device)
            generators = [generator_for(requests[i], device) for i in plain_random]
            tokens = self.draw(filtered[at], random_probs[at], generators)  # [n, vocab] each
            for i, token in zip(plain_random, tokens):
                token_ids[i] = [token]
        return SamplerOutput(token_ids, sampled_logprobs(raw, requests, starts, token_ids), errors)
