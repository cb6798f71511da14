"""Convert planted bugs from the old form (exact source text) to the form named by function.

Old form:  PlantedBug(name, file, edits, tests, why)
           each edit (exact text of `file`, found once; new text)
New form:  PlantedBug(name, file, function, edits, tests, why)
           each edit (text of `function`'s normal form, found once there; new text)
(see tests/planting.py for the normal form and how a bug is planted).

Usage, from the repository root:

    python tests/tools/convert_planted_bugs.py FILE [NAME ...]
    python tests/tools/convert_planted_bugs.py --in-place tests/planted_bugs.py
    ruff format tests/planted_bugs.py

FILE holds `PlantedBug(...)` entries in either form: a whole module such as
tests/planted_bugs.py, or a fragment pasted from one (`-` reads it from stdin). Each old-form
entry is planted in the repository's current code the old way, and the function that holds
every edited line is found (the innermost def or class, or a module- or class-level
assignment); the new-form edits are the line differences of that function's normal form before
and after, each with the fewest lines of context that make its old text occur once (a line
moved is one edit, showing the lines it moves past; a long line shows only its changed words).
The conversion is checked: planted the new way, the bug must give the module the same syntax
tree as planted the old way (docstrings' indentation aside). So convert against the code the
old-form entry was written for: at a merge, the merged tree.

Without --in-place the converted entries are printed. With --in-place FILE is rewritten: each
old-form entry is replaced by its new form, and everything else (new-form entries included) is
left as it was. NAME ... limits the work to those entries. An entry that cannot be converted
(its old text is not in the code once, its edits reach past one function, or they change no
code) is reported on stderr and left as it was; the exit status is then 1. Read what it
wrote: the edits should still show a learner the mistake (rewrite an unclear one by hand, in
the function's normal form: `python tests/planting.py FILE QUALNAME` prints it).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
from planting import (  # noqa: E402
    Named,
    PlantError,
    find,
    names_of,
    normal_form,
    plant,
    statements_in,
    without_indented_docstrings,
)

ROOT = TESTS.parent
OLD_FIELDS = ("name", "file", "edits", "tests", "why")
NEW_FIELDS = ("name", "file", "function", "edits", "tests", "why")
# The longest piece of a string literal written into an entry: planted_bugs.py's edits sit 16
# columns in, and its lines are at most 100 long.
PIECE = 78


# An f-string with a quote inside its braces (`f"{', '.join(x)}"`): the one thing
# `ast.unparse` prints differently across the Pythons the project supports.
QUOTES_IN_FSTRING = re.compile(r"""\bf(['"])[^\n]*?\{[^}\n]*['"]""")


class ConvertError(Exception):
    """An old-form entry that cannot be converted (the message says why)."""


@dataclass
class Entry:
    """One `PlantedBug(...)` call of the input, its fields' nodes by name."""

    call: ast.Call
    fields: dict[str, ast.expr]

    @property
    def is_old(self) -> bool:
        return "function" not in self.fields

    def value(self, field: str):
        return ast.literal_eval(self.fields[field])


def entries_in(tree: ast.Module) -> list[Entry]:
    """Every `PlantedBug(...)` call in `tree`, with its arguments named by field."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name != "PlantedBug":
            continue
        count = len(node.args) + len(node.keywords)
        keywords = {k.arg for k in node.keywords}
        fields_order = NEW_FIELDS if count == 6 or "function" in keywords else OLD_FIELDS
        fields = dict(zip(fields_order, node.args, strict=False))
        fields.update({k.arg: k.value for k in node.keywords if k.arg is not None})
        missing = set(fields_order) - set(fields)
        if missing:
            raise ConvertError(f"line {node.lineno}: PlantedBug(...) without {sorted(missing)}")
        found.append(Entry(node, fields))
    return sorted(found, key=lambda e: (e.call.lineno, e.call.col_offset))


# -- The function that holds the edits -------------------------------------------------------


def named_nodes(
    body: list[ast.stmt], prefix: str = "", in_function: bool = False
) -> list[tuple[str, Named]]:
    """Every node a qualified name can name, with that name, outermost first."""
    out: list[tuple[str, Named]] = []
    for node in statements_in(body):
        for name in names_of(node, in_function):
            qualname = f"{prefix}{name}"
            out.append((qualname, node))  # type: ignore[arg-type]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inside = not isinstance(node, ast.ClassDef)
                out.extend(named_nodes(node.body, f"{qualname}.", inside))
    return out


def first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def changed_lines(before: str, after: str) -> list[int]:
    """The 1-based lines of `before` that `after` changes; an insertion counts as a change of
    the line before it (the line it follows: a function's own line when it goes in first)."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    lines: list[int] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag == "equal":
            continue
        lines.extend(range(i1 + 1, i2 + 1) if i2 > i1 else [max(i1, 1)])
    return lines


def enclosing(tree: ast.Module, lines: list[int]) -> str:
    """The qualified name of the innermost node that holds every line of `lines`, and that its
    qualified name finds again."""
    holders = [
        (qualname, node)
        for qualname, node in named_nodes(tree.body)
        if first_line(node) <= min(lines) and max(lines) <= node.end_lineno  # type: ignore[operator]
    ]
    for qualname, node in sorted(holders, key=lambda h: -h[0].count(".")):
        try:
            if find(tree, qualname) is node:
                return qualname
        except PlantError:
            continue
    raise ConvertError(
        f"the edited lines {min(lines)}-{max(lines)} are not inside one function, class or "
        "assignment: split the bug, or write it by hand"
    )


# -- Edits in the normal form ----------------------------------------------------------------


# Changes at most this many unchanged lines apart are shown as one edit: a line moved down
# past two others reads as the three lines before and after, not as an insertion and a removal.
JOIN = 2
# A changed line longer than this shows only its changed words (with enough words around them
# to occur once), not the whole statement that `ast.unparse` wrote on one line.
LONG = 100


def narrowed(text: str, old_line: str, new_line: str) -> tuple[str, str] | None:
    """For one long line changed into another: the changed words and their neighbours, enough
    to occur once in `text`; None if no part of the line short of the whole one does."""
    old_line, new_line = old_line.rstrip("\n"), new_line.rstrip("\n")
    prefix = 0
    while prefix < min(len(old_line), len(new_line)) and old_line[prefix] == new_line[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(old_line), len(new_line)) - prefix
        and old_line[-1 - suffix] == new_line[-1 - suffix]
    ):
        suffix += 1
    start, end = prefix, len(old_line) - suffix
    start = old_line.rfind(" ", 0, start) if start > 0 else 0  # a word before the change
    while True:
        start = old_line.rfind(" ", 0, start) + 1 if start > 0 else 0  # to a word's start
        space = old_line.find(" ", end)
        end = len(old_line) if space < 0 else space  # to a word's end
        old = old_line[start:end]
        if start == 0 and end == len(old_line):
            return None
        if old.strip() and text.count(old) == 1:
            return old, new_line[start : len(new_line) - (len(old_line) - end)]
        start, end = max(start - 1, 0), min(end + 1, len(old_line))


def moved(a: list[str], b: list[str], first: list[int], second: list[int]) -> bool:
    """Whether two changes are one block of lines moved: inserted by one, removed by the other
    (one edit then shows the lines between, before and after the move)."""
    (i1, i2, j1, j2), (k1, k2, l1, l2) = first, second
    inserted_then_removed = i1 == i2 and l1 == l2 and b[j1:j2] == a[k1:k2]
    removed_then_inserted = k1 == k2 and j1 == j2 and a[i1:i2] == b[l1:l2]
    return inserted_then_removed or removed_then_inserted


def with_context(a: list[str], text: str, lo: int, hi: int, floor: int, up_first: bool | None):
    """The lines [lo, hi) of `a` grown by lines around them (not before `floor`) until they
    occur once in `text`: alternately up and down (`up_first` says which first), or only up
    (None: only down when up is spent)."""
    grow_up = True if up_first is None else up_first
    while True:
        old = "".join(a[lo:hi])
        if old and text.count(old) == 1:
            return lo, hi
        if (grow_up or hi >= len(a)) and lo > floor:
            lo -= 1
        elif hi < len(a):
            hi += 1
        else:
            raise ConvertError("no context makes the edit's old text occur once")
        if up_first is not None:
            grow_up = not grow_up


def normal_form_edits(before: str, after: str) -> list[tuple[str, str]]:
    """Edits that turn `before` into `after`: whole lines (or the changed words of one long
    line), applied in order, each old text found once in the text as the edits before it left
    it (context lines added until it is, the fewest characters of the ways tried)."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    hunks: list[list[int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if hunks and (i1 - hunks[-1][1] <= JOIN or moved(a, b, hunks[-1], [i1, i2, j1, j2])):
            hunks[-1][1], hunks[-1][3] = i2, j2
        else:
            hunks.append([i1, i2, j1, j2])
    edits: list[tuple[str, str]] = []
    text, done = before, 0  # `done`: lines of `a` before it are spent (edited or context)
    k = 0
    while k < len(hunks):
        i1, i2, j1, j2 = hunks[k]
        short = None
        if i2 - i1 == 1 and j2 - j1 == 1 and len(a[i1]) > LONG:
            short = narrowed(text, a[i1], b[j1])
        if short is not None:
            old, new = short
            hi = i2
        else:
            tries = [with_context(a, text, i1, i2, done, up) for up in (True, False, None)]
            lo, hi = min(tries, key=lambda t: (len("".join(a[t[0] : t[1]])), -t[0]))
            while k + 1 < len(hunks) and hi > hunks[k + 1][0]:  # grown into the next: one
                _, i2, _, j2 = hunks.pop(k + 1)
                hi = max(hi, i2)
            old = "".join(a[lo:hi])
            new = "".join(b[j1 - (i1 - lo) : j2 + (hi - i2)])
        text = text.replace(old, new)
        edits.append((old, new))
        done, k = hi, k + 1
    assert text == after, "the edits do not give the edited function"
    return edits


def convert(root: Path, file: str, old_edits: list[tuple[str, str]]) -> tuple[str, list]:
    """The new form of an old-form bug: the function that holds it, and its normal-form edits."""
    path = root / file
    if not path.is_file():
        raise ConvertError(f"{file} is not a file under {root}")
    source = path.read_text()
    mutated = source
    for old, new in old_edits:
        count = mutated.count(old)
        if count != 1:
            raise ConvertError(f"an old text occurs {count} times in {file} (expected once)")
        mutated = mutated.replace(old, new)
    tree = ast.parse(source)
    try:
        mutated_tree = ast.parse(mutated)
    except SyntaxError as exc:
        raise ConvertError(f"the old-form bug does not parse: {exc}") from exc
    if ast.dump(tree) == ast.dump(mutated_tree):
        raise ConvertError("the old-form edits change no code (comments or formatting only)")
    qualname = enclosing(tree, changed_lines(source, mutated))
    before = normal_form(find(tree, qualname))
    try:
        after = normal_form(find(mutated_tree, qualname))
    except PlantError as exc:
        raise ConvertError(f"{qualname} is gone once the bug is planted: {exc}") from exc
    edits = normal_form_edits(before, after)
    if any(QUOTES_IN_FSTRING.search(text) for edit in edits for text in edit):
        print(
            f"warning: an edit in {qualname} shows an f-string with quotes in its braces, which "
            "Python 3.12+ prints otherwise than 3.10-3.11: edit around it by hand",
            file=sys.stderr,
        )
    # The check: planted the new way, the module is what the old way made it.
    replanted = plant(source, qualname, edits)
    planted_new_way = without_indented_docstrings(ast.parse(replanted))
    if ast.dump(planted_new_way) != ast.dump(without_indented_docstrings(mutated_tree)):
        raise ConvertError(f"planted in {qualname}, the bug does not give the old form's code")
    return qualname, edits


# -- Writing entries -------------------------------------------------------------------------


def literal(text: str) -> str:
    """A Python string literal for `text`, double-quoted where that needs no more escapes."""
    r = repr(text)
    if r.startswith("'") and '"' not in text:
        r = '"' + r[1:-1] + '"'
    return r


def pieces(text: str) -> list[str]:
    """`text` cut into literals of at most about PIECE characters: at each line's end, and
    long lines after a space."""
    out = []
    for line in text.splitlines(keepends=True):
        while len(literal(line)) > PIECE:
            cut = line.rfind(" ", 0, PIECE - 2)
            cut = cut + 1 if cut > len(line) - len(line.lstrip()) else PIECE - 2
            out.append(literal(line[:cut]))
            line = line[cut:]
        out.append(literal(line))
    return out or ['""']


def write_entry(entry: Entry, source: str, qualname: str, edits: list, indent: str) -> str:
    """The new-form entry's source, at `indent`: name, file, tests and why as the input wrote
    them, then the function and its edits."""
    inner, deeper = indent + "    ", indent + "            "

    def verbatim(field: str) -> str:
        return ast.get_source_segment(source, entry.fields[field]) or repr(entry.value(field))

    lines = [
        "PlantedBug(",
        f"{inner}{verbatim('name')},",
        f"{inner}{verbatim('file')},",
        f"{inner}{literal(qualname)},",
        f"{inner}(",
    ]
    for old, new in edits:
        lines.append(f"{inner}    (")
        for text in (old, new):
            lines.extend(f"{deeper}{piece}" for piece in pieces(text))
            lines[-1] += ","
        lines.append(f"{inner}    ),")
    lines += [f"{inner}),", f"{inner}{verbatim('tests')},", f"{inner}{verbatim('why')},"]
    return "\n".join(lines) + f"\n{indent})"


def offset(source: str, line: int, col: int) -> int:
    """The character offset of (1-based line, UTF-8 byte column) in `source`."""
    lines = source.splitlines(keepends=True)
    head = "".join(lines[: line - 1])
    return len(head) + len(lines[line - 1].encode()[:col].decode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a file of PlantedBug(...) entries, or - for stdin")
    parser.add_argument("names", nargs="*", help="convert only these entries")
    parser.add_argument("--in-place", action="store_true", help="rewrite FILE")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (%(default)s)")
    args = parser.parse_args(argv)
    if args.in_place and args.file == "-":
        parser.error("--in-place needs a file")
    source = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        tree, shift = ast.parse(source), 0
    except SyntaxError:  # a fragment: entries indented, or separated by commas
        source, shift = "(\n" + source + "\n)\n", 1
        tree = ast.parse(source)
    failed, replacements = 0, []
    for entry in entries_in(tree):
        name = entry.value("name")
        if not entry.is_old or (args.names and name not in args.names):
            continue
        try:
            qualname, edits = convert(args.root, entry.value("file"), list(entry.value("edits")))
        except (ConvertError, PlantError) as exc:
            print(f"{name}: not converted: {exc}", file=sys.stderr)
            failed += 1
            continue
        call = entry.call
        line = source.splitlines()[call.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())] if args.in_place else "    "
        text = write_entry(entry, source, qualname, edits, indent)
        start = offset(source, call.lineno, call.col_offset)
        end = offset(source, call.end_lineno, call.end_col_offset)  # type: ignore[arg-type]
        replacements.append((start, end, text))
    if args.in_place:
        for start, end, text in reversed(replacements):
            source = source[:start] + text + source[end:]
        if shift:  # the fragment without the parentheses put around it
            source = source[2:-3]
        Path(args.file).write_text(source)
        print(f"{len(replacements)} converted, {failed} not", file=sys.stderr)
    else:
        for *_, text in replacements:
            print(f"    {text},")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
