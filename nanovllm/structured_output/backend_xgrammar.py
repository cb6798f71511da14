"""The xgrammar backend: a constraint compiled to a token-level automaton, and its matcher.

xgrammar (vLLM's default structured-output backend) compiles a JSON Schema, a regex or an EBNF
grammar against the tokenizer's vocabulary once; a `GrammarMatcher` then follows one output
token by token and, at any point, fills a bitmask of the tokens that may come next (one bit per
token id, 32 ids per int32 word). It can also roll back the last tokens it accepted, which
speculative decoding needs: a step's mask rows are built by tentatively accepting the proposed
tokens, and those are undone right after.

xgrammar is an optional dependency (`pip install xgrammar`, or the `structured` extra): nothing
imports it until the first request with `structured_outputs` arrives, and without it that
request is refused with a `ValueError` that says what to install.
"""

from __future__ import annotations

import importlib
import json
import re
from types import ModuleType
from typing import Any

import torch

from nanovllm.sampling_params import StructuredOutputsParams

INSTALL_HINT = "pip install xgrammar (or pip install 'nanovllm[structured]')"


def import_xgrammar() -> ModuleType:
    """The xgrammar module, or a ValueError naming what to install."""
    try:
        return importlib.import_module("xgrammar")
    except ImportError as exc:
        raise ValueError(
            f"structured_outputs needs the xgrammar package, which is not installed: {INSTALL_HINT}"
        ) from exc


def choice_as_grammar(choice: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly the given strings (vLLM's way of compiling
    `choice`). JSON string syntax is EBNF's string-literal syntax here, escapes included."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choice)


def _first_line(exc: Exception) -> str:
    """The first line of xgrammar's message, without its `[time] file.cc:line: ` prefix."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0])


class Grammar:
    """One request's matcher: where its output is in the compiled grammar."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.num_processed_tokens = 0  # output tokens accepted so far

    def accept_token(self, token: int) -> bool:
        """Advance by `token`; False (and no change) when the grammar does not allow it."""
        if not self.matcher.accept_token(token):
            return False
        self.num_processed_tokens += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.num_processed_tokens -= num_tokens

    def is_terminated(self) -> bool:
        """Whether the output is complete: the grammar accepted an end token (EOS)."""
        return self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of `bitmask` ([rows, ceil(vocab / 32)] int32, on the CPU): bit t set when
        token t may come next."""
        self.matcher.fill_next_token_bitmask(bitmask, row)


class XgrammarBackend:
    """The tokenizer's vocabulary as xgrammar sees it, built once, and the compiler over it.

    `vocab_size` is the model's (the rows of its logits); it can exceed the tokenizer's, and the
    ids past the tokenizer's are never allowed. `stop_token_ids`: the tokens that end an output
    (the model's EOS ids); the grammar allows them exactly where the output may end.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> None:
        xgr = import_xgrammar()
        self.xgr = xgr
        self.vocab_size = vocab_size
        stop = sorted(stop_token_ids) or None  # None: the tokenizer's own EOS
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop
        )
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=1, cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of `params`; a ValueError naming the value it cannot compile."""
        kind, spec = params.key
        compact = params.disable_any_whitespace
        try:
            if params.json is not None:
                return self.compiler.compile_json_schema(params.json, any_whitespace=not compact)
            if params.json_object:
                return self.compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=not compact
                )
            if params.regex is not None:
                return self.compiler.compile_regex(params.regex)
            if params.choice is not None:
                return self.compiler.compile_grammar(choice_as_grammar(list(params.choice)))
            return self.compiler.compile_grammar(params.grammar)
        except Exception as exc:  # xgrammar raises RuntimeError, ValueError, its own errors
            value = params.json if params.json is not None else spec
            name = kind.split("/")[0]
            reason = _first_line(exc)
            raise ValueError(
                f"structured_outputs.{name}={value!r} cannot be compiled: {reason}"
            ) from exc

    def matcher(self, compiled: Any) -> Grammar:
        """A fresh matcher at the start of `compiled`, for one request."""
        return Grammar(self.xgr.GrammarMatcher(compiled), self.vocab_size)
