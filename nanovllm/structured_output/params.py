"""StructuredOutputsParams: which language a request's output must belong to.

vLLM's class of the same name and fields (`from vllm.sampling_params import
StructuredOutputsParams`). Exactly one constraint is set:

- `json`: a JSON Schema (a dict, or its text); the output is a JSON value that validates.
- `regex`: the output matches the regular expression as a whole (`re.fullmatch`).
- `choice`: the output is exactly one of these strings.
- `grammar`: the output is a sentence of this EBNF grammar (GBNF-style, rule `root`).
- `json_object=True`: the output is some JSON object (OpenAI's `{"type": "json_object"}`).

`disable_any_whitespace` (vLLM's option): JSON output without free whitespace between tokens
(`{"a": 1}` is written `{"a":1}`); by default any whitespace is allowed there, as in vLLM.

The constraint is checked here only for its shape; whether the grammar compiles is found out when
the engine compiles it at `add_request` (`manager.py`), where a failure is a `ValueError` naming
the bad value.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("json", "regex", "choice", "grammar", "json_object")
            if getattr(self, name) not in (None, False)
        ]
        if not given:
            raise ValueError(
                "structured_outputs needs one constraint (json, regex, choice, grammar or "
                "json_object), but none was given"
            )
        if len(given) > 1:
            raise ValueError(
                f"structured_outputs takes one constraint, but {len(given)} were given: "
                f"{', '.join(given)}"
            )
        if self.json is not None and not isinstance(self.json, str | dict):
            raise ValueError(f"structured_outputs.json must be a dict or a str, got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"structured_outputs.{name} must be a non-empty str, got {value!r}"
                )
        choice = self.choice
        if choice is not None and (
            not isinstance(choice, list | tuple)
            or not choice
            or not all(isinstance(c, str) and c for c in choice)
        ):
            raise ValueError(
                f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                f"got {choice!r}"
            )
        if self.json_object not in (None, True, False):
            raise ValueError(
                f"structured_outputs.json_object must be a bool, got {self.json_object!r}"
            )
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(
                "structured_outputs.disable_any_whitespace must be a bool, "
                f"got {self.disable_any_whitespace!r}"
            )

    @property
    def key(self) -> tuple[str, str]:
        """(kind, spec as text): what a compiled grammar is cached by."""
        if self.json is not None:
            spec = (
                self.json if isinstance(self.json, str) else _json.dumps(self.json, sort_keys=True)
            )
            kind = "json"
        elif self.regex is not None:
            kind, spec = "regex", self.regex
        elif self.choice is not None:
            kind, spec = "choice", _json.dumps(list(self.choice))
        elif self.grammar is not None:
            kind, spec = "grammar", self.grammar
        else:
            kind, spec = "json_object", ""
        if kind in ("json", "json_object") and self.disable_any_whitespace:
            kind += "/compact"
        return kind, spec
