"""The draft-model proposer: a smaller model with the same vocabulary guesses the next k tokens.

The bet: much of a text is easy to predict, and where it is, a much smaller model often says
what the large one would. So let the small *draft* model run ahead k tokens, one cheap forward
pass each, and let the large *target* model check all k in one forward pass
(`rejection_sampler.py`). Every accepted guess is a step of the large model saved; whether that
pays depends on how often the draft is right and how much cheaper it is (nanovllm/bench/README.md,
"With a draft model", measures both).

    LLM(target, speculative_config={"model": draft_folder, "num_speculative_tokens": 4})

The draft needs the KV of everything before the token it proposes from, like any model. It gets
its own paged KV cache with the same number of blocks, addressed by the target's block tables:

- **The same slots.** Every step, after the target's forward pass, the draft runs over exactly
  the same tokens at the same positions and writes its K/V through the same `slot_mapping`
  (`draft_executor.py`). So wherever the target's cache holds a token's KV, the draft's holds its
  own for that token: a prefix-cache hit brings both, preemption loses both, and a rejected
  proposal's slots are overwritten in both by whatever is computed there next.
- **Lookahead slots.** Proposing from a request's newest token (at position N, not yet computed)
  writes the draft's KV at positions N .. N + k - 1: the newest token and each proposal but the
  last. The scheduler reserves these k slots past every request's step (`ExtraTokens.num_slots_after`,
  which `KVCacheManager.allocate_slots` takes as vLLM's `num_lookahead_tokens`), never cached.

Proposals are the draft's greedy tokens. Verification treats each as certain (a one-hot draft
distribution), so rejection sampling still emits exactly the target's distribution at any
temperature: a guess is kept with the probability the target gives it.

Cost per step: one draft forward over the step's tokens (to keep its cache in step), then k
batched one-token forwards for all decoding requests.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nanovllm.executor.model_runner import ModelRunner
from nanovllm.executor.sampler import greedy_tokens
from nanovllm.executor.step_inputs import step_metadata
from nanovllm.models.loader import load_model_args, load_tokenizer
from nanovllm.models.model_args import ModelArgs
from nanovllm.request import Request


class DraftModelProposer:
    def __init__(self, runner: ModelRunner, num_speculative_tokens: int) -> None:
        self.runner = runner  # the draft model and its KV cache
        self.k = num_speculative_tokens

    @staticmethod
    def check_draft(
        folder: Path, max_model_len: int, target_args: ModelArgs, target_tokenizer
    ) -> None:
        """Raise ValueError unless the model at `folder` can propose for the target: the same
        vocabulary, and positions as long as the target's `max_model_len`."""
        if not folder.is_dir():
            raise ValueError(
                f"speculative_config: the draft model folder {str(folder)!r} does not exist"
            )
        _, args = load_model_args(folder)
        if args.vocab_size != target_args.vocab_size:
            raise ValueError(
                f"speculative_config: the draft model {str(folder)!r} has "
                f"vocab_size={args.vocab_size}, the target {target_args.vocab_size}: a draft "
                "must share the target's vocabulary"
            )
        tokens = load_tokenizer(folder).get_vocab()
        if tokens != target_tokenizer.get_vocab():
            differ = sorted(set(tokens.items()) ^ set(target_tokenizer.get_vocab().items()))
            raise ValueError(
                f"speculative_config: the draft model {str(folder)!r} has another tokenizer than "
                f"the target ({len(differ)} (token, id) pairs differ, e.g. {differ[0]!r}): a "
                "draft must share the target's vocabulary"
            )
        if args.max_position_embeddings < max_model_len:
            raise ValueError(
                f"speculative_config: the draft model {str(folder)!r} handles "
                f"{args.max_position_embeddings} positions, fewer than max_model_len="
                f"{max_model_len}: lower max_model_len"
            )

    @torch.inference_mode()
    def propose(
        self, requests: list[Request], block_tables: list[list[int]], max_tokens: list[int]
    ) -> list[list[int]]:
        """Up to k greedy draft tokens for each decoding request (its newest token not yet
        computed), at most `max_tokens[i]` for request i, and no more than its block table has
        slots for. One batched forward pass per proposed position."""
        block_size = self.runner.block_size
        proposals: list[list[int]] = [[] for _ in requests]
        limits = [
            min(self.k, n, len(table) * block_size - (request.num_tokens - 1))
            for request, table, n in zip(requests, block_tables, max_tokens)
        ]
        for j in range(self.k):
            active = [i for i, limit in enumerate(limits) if limit > j]
            if not active:
                break
            # Pass j reads the request's newest token (j = 0) or its previous proposal, at
            # position N + j, and writes that token's draft KV there.
            tokens = [proposals[i][-1] if j else requests[i].all_token_ids[-1] for i in active]
            positions = [requests[i].num_tokens - 1 + j for i in active]
            positions_t, meta = step_metadata(
                positions,
                [1] * len(active),
                [p + 1 for p in positions],
                [block_tables[i] for i in active],
                block_size,
            )
            input_ids = torch.tensor(tokens, dtype=torch.int64)
            rows = list(range(len(active)))
            logits = self.runner.forward_logits(input_ids, positions_t, meta, rows)
            for i, token in zip(active, greedy_tokens(logits)[0]):  # [num_active] argmaxes
                proposals[i].append(token)
        return proposals
