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

# xgrammar's grammar expression kinds, as its `Grammar.serialize_json` numbers them (its C++
# `GrammarExprType`): each expression is [kind, length, data...] in `grammar_expr_data`.
_BYTE_STRING, _CHAR_CLASS, _CHAR_CLASS_STAR, _EMPTY_STR = 0, 1, 2, 3
_RULE_REF, _SEQUENCE, _CHOICES, _TAG_DISPATCH, _REPEAT = 4, 5, 6, 7, 8

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


def unproductive_rules(grammar_json: str) -> list[str] | None:
    """The names of the rules that derive no finite string, root first if it is one of them;
    None when the serialized grammar is not in the shape this reads (then nothing is claimed).

    The textbook fixed point: a rule is productive once one of its alternatives is a sequence
    whose every element is (a literal, a character class, the empty string, a productive rule,
    a repetition of one, or of any rule at least zero times). A grammar whose root is not
    productive, such as `root ::= root` or `root ::= "a" root`, matches no string a request
    could ever finish with. Unknown expression kinds count as productive, so a newer xgrammar
    can only make this check miss, never refuse a good grammar."""
    try:
        data = json.loads(grammar_json)
        rules, exprs, starts = data["rules"], data["grammar_expr_data"], data["grammar_expr_indptr"]
        root = data["root_rule_id"]

        def expr(i: int) -> tuple[int, list[int]]:
            start = starts[i]
            return exprs[start], exprs[start + 2 : start + 2 + exprs[start + 1]]

        productive = [False] * len(rules)

        def derives(i: int) -> bool:
            kind, args = expr(i)
            if kind == _RULE_REF:
                return productive[args[0]]
            if kind == _SEQUENCE:
                return all(derives(j) for j in args)
            if kind == _CHOICES:
                return any(derives(j) for j in args)
            if kind == _REPEAT:  # [rule, min, max]
                return args[1] == 0 or productive[args[0]]
            return True  # literals, character classes, empty, tag dispatch, newer kinds

        changed = True
        while changed:
            changed = False
            for r, rule in enumerate(rules):
                if not productive[r] and derives(rule[1]):
                    productive[r] = changed = True
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if productive[root]:
        return []
    order = [root] + [r for r in range(len(rules)) if r != root and not productive[r]]
    return [rules[r][0] for r in order]


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

    def parse(self, params: StructuredOutputsParams) -> Any:
        """The grammar of `params`, parsed but not compiled against the vocabulary (cheap: a
        pass over the constraint's text); a ValueError naming the value it cannot use."""
        xgr, compact = self.xgr, params.disable_any_whitespace
        try:
            if params.json is not None:
                grammar = xgr.Grammar.from_json_schema(params.json, any_whitespace=not compact)
            elif params.json_object:
                grammar = xgr.Grammar.from_json_schema(
                    '{"type": "object"}', any_whitespace=not compact
                )
            elif params.regex is not None:
                grammar = xgr.Grammar.from_regex(params.regex)
            elif params.choice is not None:
                grammar = xgr.Grammar.from_ebnf(choice_as_grammar(list(params.choice)))
            else:
                grammar = xgr.Grammar.from_ebnf(params.grammar)
        except Exception as exc:  # xgrammar raises RuntimeError, ValueError, its own errors
            raise _not_compiled(params, _first_line(exc)) from exc
        # xgrammar compiles a grammar that matches no finite string (`root ::= root`); its
        # requests could only run into a dead end or max_tokens, so it is refused here, like
        # one that does not parse.
        stuck = unproductive_rules(grammar.serialize_json())
        if stuck:
            raise _not_compiled(
                params,
                f"the grammar matches no finite string: rule {stuck[0]!r} never ends"
                + (f" (nor {', '.join(map(repr, stuck[1:4]))})" if stuck[1:] else ""),
            )
        return grammar

    def compile(self, params: StructuredOutputsParams, grammar: Any = None) -> Any:
        """`grammar` (`parse`'s; parsed here when None) compiled against the vocabulary: the
        slow part, which grows faster than the constraint (50,001 choices: seconds).
        Thread-safe; xgrammar releases the GIL while it compiles. A ValueError naming `params`
        if it fails."""
        if grammar is None:
            grammar = self.parse(params)
        try:
            return self.compiler.compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001 - xgrammar's errors, named
            raise _not_compiled(params, _first_line(exc)) from exc

    def matcher(self, compiled: Any) -> Grammar:
        """A fresh matcher at the start of `compiled`, for one request."""
        return Grammar(self.xgr.GrammarMatcher(compiled), self.vocab_size)


def _not_compiled(params: StructuredOutputsParams, reason: str) -> ValueError:
    """The error for a constraint that cannot be used, naming it and why."""
    kind, spec = params.key
    value = params.json if params.json is not None else spec
    return ValueError(
        f"structured_outputs.{kind.split('/')[0]}={value!r} cannot be compiled: {reason}"
    )
