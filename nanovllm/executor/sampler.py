"""Sampler: from one row of logits per request to one token per request.

Each request brings its own `SamplingParams`, so one batch mixes greedy and random requests with
different temperatures and filters. The filters are applied to the whole batch at once, with
per-row parameters:

1. logits / temperature (temperature 0 means greedy: argmax, no randomness at all),
2. top-k: keep the k most likely tokens,
3. top-p: keep the smallest set of most likely tokens whose probability reaches p,
4. min-p: drop tokens less likely than min_p x the most likely one,

then each random row draws from its own `torch.Generator`. A request with a `seed` owns a
generator seeded with it, which advances only when *that* request samples, so its tokens are the
same whether it runs alone or in any batch.

Log-probabilities, when asked for, are those of the model's raw distribution (before temperature
and filters), as vLLM reports them by default.
"""

from __future__ import annotations

import torch

from nanovllm.request import Request


def apply_filters(
    logits: torch.Tensor,  # [n, vocab] already divided by temperature
    top_k: torch.Tensor,  # [n] int, vocab size = disabled
    top_p: torch.Tensor,  # [n] float, 1.0 = disabled
    min_p: torch.Tensor,  # [n] float, 0.0 = disabled
) -> torch.Tensor:
    """Mask (to -inf) the tokens that top-k, top-p and min-p rule out, row by row."""
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # top-p: drop a token when the tokens ranked above it already reach p (the first never is).
    # (top_p = 1 keeps everything: a float cumsum can reach 1.0 early, so skip those rows.)
    drop = ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1)
    # min-p: relative to the most likely token (column 0 after sorting).
    drop |= probs < min_p[:, None] * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, sorted_ids, sorted_logits)


class Sampler:
    def __call__(
        self, logits: torch.Tensor, requests: list[Request]
    ) -> tuple[list[int], list[dict[int, float] | None]]:
        """logits: [n, vocab] fp32, one row per request. Returns token ids and logprobs."""
        tokens = logits.argmax(dim=-1)  # greedy rows are done; random rows are overwritten
        random_rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            params = [requests[i].sampling_params for i in random_rows]
            vocab = logits.shape[-1]
            temperature = torch.tensor([p.temperature for p in params], device=logits.device)
            top_k = torch.tensor(
                [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params],
                device=logits.device,
            )
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            min_p = torch.tensor([p.min_p for p in params], device=logits.device)
            filtered = apply_filters(logits[rows] / temperature[:, None], top_k, top_p, min_p)
            probs = filtered.softmax(dim=-1)
            for j, i in enumerate(random_rows):
                generator = requests[i].generator
                tokens[i] = torch.multinomial(probs[j], 1, generator=generator)[0]
        token_list = tokens.tolist()
        logprobs: list[dict[int, float] | None] = [None] * len(requests)
        wanted = [i for i, r in enumerate(requests) if r.sampling_params.logprobs is not None]
        if wanted:
            raw = logits[wanted].log_softmax(dim=-1)
            for j, i in enumerate(wanted):
                n = requests[i].sampling_params.logprobs
                top = raw[j].topk(n) if n else None
                entry = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist()))
                entry[token_list[i]] = raw[j, token_list[i]].item()
                logprobs[i] = entry
        return token_list, logprobs
