"""Sample logprobs: for each sampled token, its log-probability, its rank, and the top n.

They are read from the raw distribution, log_softmax of the model's logits before any logits
processor, temperature or filter (vLLM's default, `logprobs_mode="raw_logprobs"`). A request
with `logprobs=n` gets, per new token, a dict {token id: (logprob, rank)} holding the n most
likely tokens (ranks 1..n) and the sampled token, whose rank is, as vLLM counts it, the number
of tokens whose logprob is >= its own. `logprobs=-1` asks for the whole vocabulary.
"""

from __future__ import annotations

import torch

from nanovllm.request import Request

# Per request: per new token, {token id: (logprob, rank)}; None when it asked for no logprobs.
SampleLogprobs = list[list[dict[int, tuple[float, int]]] | None]


def sampled_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab], raw
    requests: list[Request],
    starts: list[int],  # each request's first row
    token_ids: list[list[int]],  # each request's new tokens
) -> SampleLogprobs:
    """The logprob entries of every new token of the requests that asked for them."""
    out: SampleLogprobs = [None] * len(requests)
    vocab = logits.shape[-1]
    for i, request in enumerate(requests):
        n = request.sampling_params.logprobs
        if n is None or not token_ids[i]:
            continue
        n = vocab if n == -1 else n
        rows = logits[starts[i] : starts[i] + len(token_ids[i])].log_softmax(dim=-1)
        tokens = torch.tensor(token_ids[i], device=rows.device)
        chosen = rows.gather(1, tokens[:, None])  # [num_new, 1]
        ranks = (rows >= chosen).sum(dim=-1).tolist()  # [num_new]
        top = rows.topk(n) if n else None
        entries = []
        for j, (token, logprob) in enumerate(zip(token_ids[i], chosen[:, 0].tolist())):
            entry: dict[int, tuple[float, int]] = {}
            if top is not None:
                ids, values = top.indices[j].tolist(), top.values[j].tolist()
                entry = {t: (v, rank) for rank, (t, v) in enumerate(zip(ids, values), start=1)}
            entry[token] = (logprob, ranks[j])
            entries.append(entry)
        out[i] = entries
    return out
