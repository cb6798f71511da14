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

Drawing a token: the "exponential race" vLLM uses instead of `torch.multinomial`. Draw
q_i ~ Exp(1) for every token and take argmax_i p_i / q_i; token i wins with probability exactly
p_i (the smallest of independent exponentials with rates p_i is the i-th with probability
p_i / sum p). It needs no CPU-GPU synchronisation, and each row's noise comes from its request's
own `torch.Generator`.

Generators live where sampling happens. Each random request's generator is created on the
device of the logits, seeded with the request's seed: a CPU generator cannot drive random ops on
CUDA tensors. It advances only when *that* request samples, so the noise a seeded request draws
does not depend on what else shares the batch. Its logits can: a matmul over a different batch
shape rounds differently (here about 4e-6 apart), so a draw that lands that close to the
boundary between two tokens can pick the other one. Same seed and same batch, same tokens.

A row whose distribution is not finite (NaN logits from a broken model, or an overflow) fails
alone: the sampler reports it in `errors` and the engine finishes that request with an error;
the other rows of the batch are sampled as usual.

Log-probabilities, when asked for, are those of the model's raw distribution (before temperature
and filters), as vLLM reports them by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nanovllm.request import Request


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row; -1 where the row failed (see `errors`)
    logprobs: list[dict[int, float] | None]  # per row, when the request asked for them
    errors: dict[int, str] = field(default_factory=dict)  # row -> why it could not be sampled


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


def generator_for(request: Request, device: torch.device) -> torch.Generator:
    """The request's own generator, on `device` (made on first use from `request.seed`)."""
    generator = request.generator
    if generator is None or generator.device != device:
        assert request.seed is not None, "a random request always has a seed (the engine's)"
        generator = torch.Generator(device=device).manual_seed(request.seed)
        request.generator = generator
    return generator


class Sampler:
    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        """logits: [n, vocab] fp32, one row per request."""
        device = logits.device
        tokens = logits.argmax(dim=-1)  # greedy rows are done; random rows are overwritten
        bad = torch.isnan(logits).any(dim=-1)  # [n]
        random_rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=device)
            params = [requests[i].sampling_params for i in random_rows]
            vocab = logits.shape[-1]
            temperature = torch.tensor([p.temperature for p in params], device=device)
            top_k = torch.tensor(
                [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=device
            )
            top_p = torch.tensor([p.top_p for p in params], device=device)
            min_p = torch.tensor([p.min_p for p in params], device=device)
            filtered = apply_filters(logits[rows] / temperature[:, None], top_k, top_p, min_p)
            probs = filtered.softmax(dim=-1)  # [num_random, vocab]
            bad[rows] |= torch.isnan(probs).any(dim=-1)
            noise = torch.empty_like(probs)
            for j, i in enumerate(random_rows):
                noise[j].exponential_(generator=generator_for(requests[i], device))
            noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # an exact 0 would make 0 / 0
            tokens[rows] = (probs / noise).argmax(dim=-1)
        token_list = tokens.tolist()
        errors = {}
        if bad.any():
            for i in torch.nonzero(bad).flatten().tolist():
                params = requests[i].sampling_params
                errors[i] = (
                    f"request {requests[i].request_id!r}: the next-token distribution is not "
                    f"finite (NaN in the logits or probabilities at temperature="
                    f"{params.temperature!r}); the request was stopped"
                )
                token_list[i] = -1
        logprobs: list[dict[int, float] | None] = [None] * len(requests)
        wanted = [
            i
            for i, r in enumerate(requests)
            if r.sampling_params.logprobs is not None and i not in errors
        ]
        if wanted:
            raw = logits[wanted].log_softmax(dim=-1)
            for j, i in enumerate(wanted):
                n = requests[i].sampling_params.logprobs
                top = raw[j].topk(n) if n else None
                entry = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist()))
                entry[token_list[i]] = raw[j, token_list[i]].item()
                logprobs[i] = entry
        return SamplerOutput(token_list, logprobs, errors)
