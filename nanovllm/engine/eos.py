"""Which tokens end a request: the model's end-of-sequence set.

A checkpoint can name more than one EOS token, in two places: `config.json`'s `eos_token_id`
(an int or a list: Llama 3.1 Instruct lists `<|end_of_text|>`, `<|eom_id|>` and `<|eot_id|>`)
and `generation_config.json`'s, which transformers' `generate` reads first. A chat model
ends its turn with one of these (often not the tokenizer's own `eos_token`), so stopping on only
the first id would let it run on past the end of its answer.

The rule, as transformers applies it: the union of both files' ids; the tokenizer's
`eos_token_id` only when neither file names one.
"""

from __future__ import annotations

import json
from pathlib import Path


def _as_ids(value: object) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list | tuple):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def eos_token_ids(path: Path, hf_config: dict, tokenizer) -> frozenset[int]:
    """The ids that end generation for the checkpoint in `path` (see the module docstring)."""
    ids = _as_ids(hf_config.get("eos_token_id"))
    generation_config = path / "generation_config.json"
    if generation_config.is_file():
        try:
            ids |= _as_ids(json.loads(generation_config.read_text()).get("eos_token_id"))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            pass  # an unreadable generation config is optional: config.json still counts
    if not ids:
        ids = _as_ids(getattr(tokenizer, "eos_token_id", None))
    return frozenset(ids)
