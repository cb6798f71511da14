"""The n-gram proposer (prompt lookup decoding): guess the next tokens from the request itself.

Text repeats: code repeats identifiers, a summary repeats its source, a model's own long output
repeats its phrases. So take the last n tokens of the request (prompt and output so far), find
the most recent earlier place where the same n tokens occur, and propose the k tokens that
followed them there. Longer matches are tried first (n from `prompt_lookup_max` down to
`prompt_lookup_min`): a longer context is a better predictor. No proposal when nothing matches.

Proposing costs no model at all, only a search of the request's tokens: O(length x n) per
request and step in this plain Python version (vLLM's uses KMP under numba). A wrong proposal
costs little too: it is verified and rejected in the same forward pass (`rejection_sampler.py`).
"""

from __future__ import annotations


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: list[int], max_tokens: int | None = None) -> list[int]:
        """Up to min(k, max_tokens) tokens that followed the latest earlier match of the last n."""
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        if k <= 0:
            return []
        length = len(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = token_ids[length - n :]
            # The latest start i < length - n where token_ids[i : i + n] == suffix.
            for i in range(length - n - 1, -1, -1):
                if token_ids[i] == suffix[0] and token_ids[i : i + n] == suffix:
                    return token_ids[i + n : i + n + k]
        return []
