"""The plain path names few optional features: the count of its code lines that do is a budget.

The plain path (README.md's "Read the engine") is what a learner reads first. Speculative
decoding, KV connectors, structured outputs and tensor parallelism reach it only through its
seams (the scheduler's KV source and `ExtraTokens`, the step's logits mask ...), with their
arithmetic on their own side, so at most `BUDGET` code lines of it name one.

The oracle is the source itself: its tokens (`tokenize`), less comments and docstrings (found
with `ast`); a line counts when one of its tokens holds a word of `FEATURE_WORDS`, anywhere in
an identifier or a string (`num_external`, `logits_mask` and `to_verify` all count), but for
the few names torch gives (`masked_fill`, `attn_mask`), which no engine code chose.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Wide on purpose: every spelling of an optional feature, matched inside identifiers too
# (regular expressions).
FEATURE_WORDS = (
    "external",
    "verify",
    # Worker and process groups (tensor parallelism), in the spellings the engine uses; not a
    # bare "group": KV cache groups (`core/kv_cache_interface.py`) are the core, not an option.
    "worker_?group",
    "process_?group",
    "cpu_group",
    "new_group",
    "mask",
    "lookahead",
    "connector",
    "speculat",
    "grammar",
    "rank",
    "draft",
    "propos",
    "structured",
)
FEATURE = re.compile("|".join(FEATURE_WORDS), re.IGNORECASE)
# Names torch chose, not the engine: paged attention's causal mask and the sampler's filters.
TORCH_NAMES = {"masked_fill", "masked_fill_", "attn_mask"}
BUDGET = 15  # code lines of the whole plain path


def plain_path() -> list[str]:
    """The files of README.md's "Read the engine" table, in reading order."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Read the engine") :]
    section = section[: section.index("\n\n", section.index("| # |"))]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")]
    return [c[2].strip(" `") for c in rows if c[1].strip().isdigit()]


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of the module's, its classes' and its functions' docstrings."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def feature_lines(source: str) -> list[int]:
    """The code lines (not comments, not docstrings) that hold a feature word."""
    docstrings = docstring_lines(ast.parse(source))
    found = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or token.start[0] in docstrings:
            continue
        if FEATURE.search(token.string) and token.string not in TORCH_NAMES:
            found.add(token.start[0])
    return sorted(found)


def test_the_counter_finds_feature_words_in_code_and_nowhere_else() -> None:
    source = '''"""A module docstring that names a grammar and a KV connector."""
import os  # a comment on speculation


def f(request, num_external, logits_mask):  # 5: parameters
    """The docstring of f: tokens to verify, a logits mask."""
    budget = 3  # the lookahead of a draft model, in a comment
    to_verify = request.proposals[:budget]  # 8: two words
    total = num_external + len(to_verify)  # 9
    name = "worker_group"  # 10: in a string
    groups = request.kv_cache_groups  # a KV cache group is no optional feature
    total = total.masked_fill(total < 0, 0)  # torch's name alone
    total = total.masked_fill(logits_mask, 0)  # 12: and one of ours
    return os.path.join(str(total), name, groups)
'''
    assert feature_lines(source) == [5, 8, 9, 10, 13]


def test_the_plain_path_names_few_optional_features() -> None:
    counts = {}
    lines = {}
    for file in plain_path():
        source = (REPO / file).read_text()
        found = feature_lines(source)
        counts[file] = len(found)
        text = source.splitlines()
        lines[file] = [f"  {file}:{n}: {text[n - 1].strip()}" for n in found]
    total = sum(counts.values())
    table = "\n".join(f"{n:4d}  {file}" for file, n in counts.items())
    listing = "\n".join(line for file in lines for line in lines[file])
    assert total <= BUDGET, (
        f"{total} code lines of the plain path name an optional feature "
        f"(budget {BUDGET}):\n{table}\n{listing}"
    )
