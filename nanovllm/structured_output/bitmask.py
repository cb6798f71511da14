"""The grammar's mask on the logits: tokens the grammar does not allow get -inf.

A bitmask row holds one bit per token id (id t is bit t % 32 of int32 word t // 32; set means
allowed). Setting a disallowed token's logit to -inf gives it probability 0 under any
temperature and filter, and greedy decoding never picks it, so the sampler needs no change:
the mask is applied to the logits before it runs, for greedy and random requests alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GrammarBitmask:
    """One step's masks: `bitmask[i]` applies to logits row `rows[i]`."""

    rows: list[int]  # logits rows (in the step's order of sampling rows)
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's logits mask (`core/logits_mask.py`): `apply_grammar_bitmask`."""
        return apply_grammar_bitmask(logits, self)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, vocab_size] bool: True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask[:, :, None] >> shifts) & 1  # [rows, words, 32]
    return bits.flatten(1)[:, :vocab_size].bool()


@torch.inference_mode()
def apply_grammar_bitmask(
    logits: torch.Tensor | None, grammar_bitmask: GrammarBitmask | None
) -> torch.Tensor | None:
    """`logits` ([num_rows, vocab]) with the disallowed tokens of the masked rows at -inf
    (in place)."""
    if logits is None or grammar_bitmask is None:
        return logits
    allowed = unpack_bitmask(grammar_bitmask.bitmask.to(logits.device), logits.shape[-1])
    for i, row in enumerate(grammar_bitmask.rows):  # (row by row, in place: no gather/scatter)
        logits[row].masked_fill_(~allowed[i], float("-inf"))
    return logits
