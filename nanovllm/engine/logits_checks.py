"""The checks of a request's logits-processing fields that need the vocabulary or tokenizer.

`SamplingParams` checks what it can alone (ranges, types); the token ids in `logit_bias`,
`allowed_token_ids` and `stop_token_ids`, and the tokens `bad_words` become, can only be checked
against the model's vocabulary, which the engine knows: `input_processor.py` calls this before
the request takes anything, so a bad id is a ValueError naming it and the request never runs.
The message names the first few bad ids and how many there are, never all of them: a request
with 100,000 bad ids gets an error of a line, not of its own size.
"""

from __future__ import annotations

from nanovllm.sampling_params import SamplingParams


def check_token_ids_in_vocab(params: SamplingParams, tokenizer, vocab_size: int) -> None:
    """Raise ValueError naming the first id outside [0, vocab_size); tokenize `bad_words`."""
    for name, ids in (
        ("logit_bias", list(params.logit_bias or {})),
        ("allowed_token_ids", params.allowed_token_ids or []),
        ("stop_token_ids", params.stop_token_ids or []),
    ):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"{name} token id(s) {some(bad)} are outside the vocabulary [0, {vocab_size})"
            )
    if params.prompt_logprobs is not None and params.prompt_logprobs > vocab_size:
        raise ValueError(
            f"prompt_logprobs={params.prompt_logprobs} exceeds the vocabulary size {vocab_size}"
        )
    if not params.bad_words:
        return
    if tokenizer is None:
        raise ValueError(f"bad_words={params.bad_words!r} needs a tokenizer")
    params.update_from_tokenizer(tokenizer)
    bad = [t for word in params.bad_words_token_ids for t in word if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"bad_words tokenize to id(s) {some(bad)} outside the vocabulary [0, {vocab_size})"
        )


def some(items: list, shown: int = 5) -> str:
    """The first `shown` items and how many more: an error message's bounded list."""
    listed = ", ".join(repr(x) for x in items[:shown])
    more = len(items) - shown
    return f"[{listed}{f', ... ({more:,} more)' if more > 0 else ''}]"
