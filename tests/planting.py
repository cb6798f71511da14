"""Planting a bug in one function, whatever the code's formatting.

A planted bug (`planted_bugs.py`) names the function it lives in, by qualified name:
`function`, `Class.method`, `outer.inner`, or a module-level (or class-level) name bound by an
assignment. Its edits are written in that function's *normal form*: the function's source as
`ast.unparse` prints it. The normal form depends on the code's syntax tree alone: line breaks,
quotes, parentheses a formatter adds, comments and the function's depth in the file all vanish
from it. So a bug keeps working when `ruff format` rewraps the file, when comments change, and
when the function moves within its file.

To plant a bug in a file's source:
1. find the function's node in the file's syntax tree, by its qualified name (exactly one);
2. print it in normal form: the function's own `def` at column 0, one statement per line,
   docstrings as `inspect.cleandoc` gives them (a reformat may re-indent a docstring's lines);
3. apply each edit (old text, found exactly once in the normal form as it stands; new text);
4. check the result parses, and that its syntax tree differs from the original (an edit that
   changes nothing is a defect of the entry, not a bug the suite missed);
5. write the result over the function's lines (decorators included), indented as it was.
The planted file is checked once more: parsed again, the function there must be the edited one.
Comments inside the planted function are lost in the copy; nothing runs them.

`python tests/planting.py FILE QUALNAME` prints a function's normal form, to write an entry.
"""

from __future__ import annotations

import ast
import copy
import inspect
import io
import sys
import tokenize
from collections.abc import Iterable, Sequence

# A node that can hold the bug: what a qualified name may name.
Named = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign


class PlantError(Exception):
    """The bug cannot be planted as written: rewrite the entry for the current code."""


def names_of(node: ast.stmt, in_function: bool = False) -> list[str]:
    """The names `node` binds that a qualified name may give: a def's or class's name, or the
    plain names an assignment binds (`X = ...`, `X: int = ...`, `A = B = ...`) in a module or a
    class (a function's local variables are part of the function, never named apart)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if in_function:
        return []
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def statements_in(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of one scope's body, including those inside `if`, `try`, `with`, `for`
    and `while` blocks (a function defined under `if HAVE_NUMBA:` is still the module's), but
    not inside nested defs or classes (those are the next scope)."""
    for node in body:
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, []) or []:
                if isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from statements_in(child.body)
                elif isinstance(child, ast.stmt):
                    yield from statements_in([child])


def find(tree: ast.Module, qualname: str) -> Named:
    """The one node `qualname` names in `tree` (`Class.method`, `function.inner`, `NAME`)."""
    scope: Sequence[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for depth, part in enumerate(qualname.split(".")):
        in_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        found = [n for n in statements_in(scope) if part in names_of(n, in_function)]
        where = ".".join(qualname.split(".")[:depth]) or "the module"
        if not found:
            raise PlantError(f"{part!r} is not defined in {where} (looking for {qualname!r})")
        if len(found) > 1:
            lines = ", ".join(str(n.lineno) for n in found)
            raise PlantError(f"{part!r} is defined {len(found)} times in {where} (lines {lines})")
        node = found[0]
        scope = getattr(node, "body", [])
    assert node is not None
    return node  # type: ignore[return-value]


def without_indented_docstrings(node: ast.AST) -> ast.AST:
    """A copy of `node` with each docstring as `inspect.cleandoc` gives it: a docstring's later
    lines carry the indentation of the code around it, which a reformat may change."""
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = n.body[0] if n.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    first.value.value = inspect.cleandoc(first.value.value)
    return node


if sys.version_info >= (3, 11):
    unparse = ast.unparse
else:

    class _Unparser310(ast._Unparser):  # type: ignore[name-defined]
        """Python 3.10's `ast.unparse` with 3.11's tuple targets (`a, b = ...`, `for a, b in`,
        not `(a, b) = ...`), so that a function's normal form is the same on every Python the
        project supports. (3.12 and later differ in one thing: an f-string holding quotes in
        its braces keeps its own quotes there; an edit had better not show one.)"""

        def visit_Tuple(self, node: ast.Tuple) -> None:
            wrap = len(node.elts) == 0 or self.get_precedence(node) > ast._Precedence.TUPLE
            with self.delimit_if("(", ")", wrap):
                self.items_view(self.traverse, node.elts)

        def visit_Assign(self, node: ast.Assign) -> None:
            for target in node.targets:
                self.set_precedence(ast._Precedence.TUPLE, target)
            super().visit_Assign(node)

        def _for_helper(self, fill: str, node: ast.For | ast.AsyncFor) -> None:
            self.set_precedence(ast._Precedence.TUPLE, node.target)
            super()._for_helper(fill, node)

    def unparse(node: ast.AST) -> str:
        return _Unparser310().visit(node)


def normal_form(node: ast.AST) -> str:
    """`node`'s source as `ast.unparse` prints it (docstrings cleaned of their indentation),
    each line ending in a newline."""
    return unparse(without_indented_docstrings(node)) + "\n"


def normal_form_of(source: str, qualname: str) -> str:
    """The normal form of the function `qualname` names in `source`."""
    return normal_form(find(ast.parse(source), qualname))


def apply_edits(text: str, edits: Sequence[tuple[str, str]], what: str) -> str:
    """`text` with each edit applied in turn; each old text must occur exactly once in the text
    as the edits before it left it."""
    for old, new in edits:
        if not old:
            raise PlantError(f"{what}: an edit's old text is empty")
        count = text.count(old)
        if count != 1:
            raise PlantError(
                f"{what}: the old text occurs {count} times in the function's normal form "
                f"(expected once)\n--- old text:\n{old}--- normal form:\n{text}"
            )
        text = text.replace(old, new)
    return text


def edited_normal_form(source: str, qualname: str, edits: Sequence[tuple[str, str]]) -> str:
    """The function's normal form with `edits` applied, checked to parse and to change the
    function's syntax tree."""
    before = normal_form_of(source, qualname)
    after = apply_edits(before, edits, qualname)
    try:
        edited = ast.parse(after)
    except SyntaxError as exc:
        raise PlantError(f"{qualname}: the edited function does not parse: {exc}\n{after}") from exc
    if ast.dump(edited) == ast.dump(ast.parse(before)):
        raise PlantError(f"{qualname}: the edits leave the function's syntax tree unchanged")
    return after


def string_continuation_lines(text: str) -> set[int]:
    """The 1-based numbers of the lines of `text` that begin inside a string literal (the later
    lines of a triple-quoted string): indenting those would change the string."""
    inside: set[int] = set()
    open_rows: list[int] = []  # f-strings in 3.12+: FSTRING_START ... FSTRING_END
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING:
            inside.update(range(token.start[0] + 1, token.end[0] + 1))
        elif token.type == fstring_start:
            open_rows.append(token.start[0])
        elif token.type == fstring_end:
            inside.update(range(open_rows.pop() + 1, token.end[0] + 1))
    return inside


def indented(text: str, indent: str) -> str:
    """`text` (a statement printed at column 0) indented by `indent`, except inside strings."""
    keep = string_continuation_lines(text)
    lines = text.splitlines(keepends=True)
    return "".join(
        line if number in keep or not line.strip() else indent + line
        for number, line in enumerate(lines, start=1)
    )


def plant(source: str, qualname: str, edits: Sequence[tuple[str, str]]) -> str:
    """`source` (a module's text) with the function `qualname` replaced by its edited normal
        form, written over the function's lines at the function's indentation (its docstrings
    cleaned of their indentation, as `inspect.getdoc` gives them)."""
    node = find(ast.parse(source), qualname)
    after = edited_normal_form(source, qualname, edits)
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    lines = source.splitlines(keepends=True)
    head, tail = lines[first - 1], lines[node.end_lineno - 1]  # type: ignore[operator]
    indent = head[: len(head) - len(head.lstrip())]
    rest = tail[node.end_col_offset :].strip()  # type: ignore[misc]
    if rest and not rest.startswith("#"):
        raise PlantError(f"{qualname}: its last line goes on after it ({rest!r})")
    planted = (
        "".join(lines[: first - 1]) + indented(after, indent) + "".join(lines[node.end_lineno :])
    )
    # Parsed again, the planted file must hold the edited function where the original was.
    try:
        tree = ast.parse(planted)
    except SyntaxError as exc:
        raise PlantError(f"{qualname}: the planted file does not parse: {exc}") from exc
    if ast.dump(find(tree, qualname)) != ast.dump(ast.parse(after).body[0]):
        raise PlantError(f"{qualname}: the planted function is not the edited one")
    return planted


if __name__ == "__main__":  # python tests/planting.py FILE QUALNAME: the function's normal form
    path, qualname = sys.argv[1:3]
    with open(path) as f:
        print(normal_form_of(f.read(), qualname), end="")
