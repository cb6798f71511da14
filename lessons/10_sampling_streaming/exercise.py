"""Lesson 10 exercise: top-k and top-p filtering, and incremental detokenization.

Check with `nanovllm lesson 10 --check`.
"""

from __future__ import annotations

import torch

from nanovllm.engine.detokenizer import DetokenizerState  # noqa: F401  (the state you update)


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row and set all others to -inf.

    logits: [num_rows, vocab] float. 1 <= k; if k >= vocab, nothing is removed. As in vLLM, a
    logit equal to the k-th largest stays too: keep every entry >= the row's k-th largest
    value, so a row keeps more than k entries when logits tie at the boundary. Kept logits
    are unchanged. Return a new tensor; do not modify `logits`.
    """
    raise NotImplementedError("write apply_top_k (lesson 10)")


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep, per row, the smallest set of most likely tokens whose probabilities (softmax of the
    row) sum to at least p; set all others to -inf.

    logits: [num_rows, vocab] float; 0 < p <= 1. The most likely token is always kept, and
    p = 1 keeps every token (top-p off, as in vLLM: in float32 the running sum can reach 1.0
    before the last, least likely tokens). Kept logits are unchanged. Return a new tensor; do
    not modify `logits`.
    Hint: a token is dropped exactly when the tokens ranked above it already sum to >= p.
    """
    raise NotImplementedError("write apply_top_p (lesson 10)")


def detokenize_step(tokenizer, state: DetokenizerState, output_ids: list[int]) -> str:
    """Append the text of the newest token(s) in `output_ids` to `state.text`; return that text.

    `tokenizer.decode(ids)` gives the text of a list of token ids. `state` carries
    `prefix_offset` and `read_offset` (both start at 0) between calls:

        prefix_text = decode(output_ids[prefix_offset:read_offset])
        new_text    = decode(output_ids[prefix_offset:])

    If new_text is not longer than prefix_text, or ends with "\ufffd" (half a character), return
    "" and change nothing. Otherwise the new text is new_text[len(prefix_text):]: add it to
    `state.text`, set prefix_offset = read_offset and read_offset = len(output_ids), return it.
    """
    raise NotImplementedError("write detokenize_step (lesson 10)")
