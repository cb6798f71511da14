"""What the executor panel says beyond the executor's own figures: the text of the tokens a step
sampled, and why there is no step to show.

The executor's events carry token ids only (the runner has no tokenizer). The text of a
sampled token comes a moment later, in the same step, from the detokenizer: one
`TokenEmitted` per token, with its id and the text it added. A token whose bytes end in the
middle of a character adds no text (`''`) until the next one completes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanovllm.events import TokenEmitted

if TYPE_CHECKING:
    from nanovllm.viz.driver import DriverStatus
    from nanovllm.viz.state import VizState


def sampled_texts(
    state: VizState, step: int, request_id: str, token_ids: tuple[int, ...]
) -> list[str | None]:
    """The text each of `token_ids` (sampled by `request_id` in `step`) added to its output,
    in order; None for a token not emitted (yet: it comes right after the sampling, or never,
    past a stop)."""
    emitted = [
        (e.token_id, e.text_delta)
        for record in (state.last_step, state.draft)
        if record is not None
        for e in record.events
        if isinstance(e, TokenEmitted) and e.step == step and e.request_id == request_id
    ]
    texts: list[str | None] = []
    for i, token in enumerate(token_ids):
        emitted_here = i < len(emitted) and emitted[i][0] == token
        texts.append(emitted[i][1] if emitted_here else None)
    return texts


def sampled_words(
    state: VizState, step: int, request_id: str, token_ids: tuple[int, ...]
) -> list[str]:
    """`472 ' the'` for each sampled token: its id and, once emitted, its text."""
    texts = sampled_texts(state, step, request_id, token_ids)
    return [str(t) if text is None else f"{t} {text!r}" for t, text in zip(token_ids, texts)]


def no_step_words(state: VizState, status: DriverStatus | None) -> str:
    """Why the panel has no executor step to show."""
    if state.step == 0:  # (no step has ended, and the one playing has no inputs yet)
        return "no executor step yet: the first step has not built its inputs"
    if status is not None and status.mode == "replay":
        return "no executor step: this trace was recorded before the executor's events existed"
    return "no executor step in the events received so far"
