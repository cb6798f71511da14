"""The suite catches every planted bug of `planted_bugs.py`.

Each bug is planted (`planting.py`: in its function's normal form, written back over the
function) in a copy of the package (a tree of links to the real files, with the one
edited file written out), and the tests named for it run against that copy in a process of
their own, with CI's hypothesis examples. They must fail. The same tests without the bug pass,
which the rest of the suite shows; and a few of them (`CONTROLS`) run without the bug the way
the bugs' runs do, which must pass too.

Each run is a fork of a server that imported torch, transformers and pytest's plugins once
(`forked_pytest.py`), since a fresh interpreter spent seconds importing them for every bug.

Each copy serves many bugs of a test session: a bug swaps its edited file in and puts the link
back after. So what the copy's processes cache beside its files survives from bug to bug, numba's
compiled kernels above all (`cache=True` writes them to the copy's `__pycache__`); a fresh copy
per bug compiled them again for every bug that runs a kernel. Both swaps remove the file's
bytecode, so no bug ever runs another's (or the original's) stale `.pyc`. Two copies take bugs
at once (`NUM_COPIES`), each planting one bug at a time in its own files.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from forked_pytest import ForkedPytest, RunTimedOut
from planted_bugs import PLANTED_BUGS, PlantedBug
from planting import PlantError, normal_form_of, plant, without_indented_docstrings

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# Where each top-level folder of the repository lives once installed (setup.py).
INSTALLED = {
    "nanovllm": "nanovllm",
    "kernels": "nanovllm/kernels",
    "viz": "nanovllm/viz",
    "lessons": "nanovllm/lessons",
}


def mirror(dest: Path) -> None:
    """A copy of the installed package made of links to the repository's files."""
    for folder, target in INSTALLED.items():
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            link = dest / target / path.relative_to(ROOT / folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
        seed_numba_cache(ROOT / folder, dest / target)


def seed_numba_cache(source: Path, dest: Path) -> None:
    """Copy the repository's compiled numba kernels (`cache=True`: `__pycache__/*.nbi` indexes and
    their `*.nbc` code) into the copy's `__pycache__`, so that the copy's first process loads
    them instead of compiling them again (seconds a kernel). Copies, not links: a bug planted in
    a kernel's file makes the copy's processes write that file's cache, which must never reach
    the repository's. Numba checks each index against its source file's mtime and size, which
    the copy's links share with the repository's files; a planted file's differ, so its
    kernels are compiled afresh."""
    for cached in source.rglob("__pycache__/*.nb[ic]"):
        copy = dest / cached.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cached, copy)


def installed(dest: Path, file: str) -> Path:
    """Where the repository's `file` lies in the copy at `dest`."""
    folder = file.split("/")[0]
    return dest / INSTALLED[folder] / Path(file).relative_to(folder)


def forget_bytecode(path: Path) -> None:
    """Remove `path`'s cached bytecode: a swap within one second, to a file of the same size,
    would otherwise look unchanged to Python (a .pyc records the source's mtime in seconds)."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


# Python 3.11's `ast` counts its recursion depth in one place for every thread, so two threads
# parsing at once can fail with "AST constructor recursion depth mismatch" (CPython issue
# gh-106905; it happened once in CI): the copies' threads plant one at a time.
AST_LOCK = threading.Lock()


@contextmanager
def planted(bug: PlantedBug, dest: Path) -> Iterator[None]:
    """The copy at `dest` with `bug` planted in it for the duration; then the link again."""
    with AST_LOCK:
        source = plant((ROOT / bug.file).read_text(), bug.function, bug.edits)
    target = installed(dest, bug.file)
    assert target.is_symlink(), f"{target} is not the repository's file: a bug was left planted"
    target.unlink()
    target.write_text(source)
    forget_bytecode(target)
    try:
        yield
    finally:
        target.unlink()
        target.symlink_to(ROOT / bug.file)
        forget_bytecode(target)


# Bugs are planted two at a time, in two copies of the package (the CI machine has two cores):
# these runs take much of the full tier's time, and one at a time they left a core mostly idle.
NUM_COPIES = 2


@dataclass
class Outcome:
    returncode: int
    tail: str


def plant_and_run(bug: PlantedBug, dest: Path, server: ForkedPytest) -> Outcome:
    """Run `bug`'s tests against the copy at `dest` with the bug planted, in a fork of the
    copy's server."""
    with planted(bug, dest):
        return run_tests(bug.tests, dest, server)


def run_tests(tests: tuple[str, ...], dest: Path, server: ForkedPytest) -> Outcome:
    """`tests` run against the copy at `dest`, stopping at the first failure."""
    args = [str(ROOT / a) if a.startswith("tests/") else a for a in tests]
    log = dest.parent / f"{dest.name}.log"
    try:
        returncode, imported = server.run(
            ["-x", "-q", "-p", "no:cacheprovider", *args], log, timeout=600
        )
    except RunTimedOut as exc:
        return Outcome(-1, str(exc))
    output = log.read_text(errors="replace")
    if not imported.startswith(str(dest)):
        return Outcome(-1, f"the copy was not imported: {imported}\n{output[-1500:]}")
    return Outcome(returncode, output[-2000:])


def start_server(dest: Path) -> ForkedPytest:
    """The copy's pytest server: run from the copy's folder, which Python puts first on
    sys.path, so the repository's own `nanovllm/` does not shadow the copy."""
    env = dict(os.environ, PYTHONPATH=str(dest), HYPOTHESIS_PROFILE="planted")
    return ForkedPytest(dest, env)


# Runs without a bug, in the servers' forks: each must pass, or the forks themselves (not a
# bug) could be what fails the bugs' runs. The engine against transformers, a data structure's
# state machine, and a kernel's test (the kernels' conftest sets TRITON_INTERPRET before triton
# is imported).
CONTROLS = (
    "qwen3-qk-norm-after-rope",
    "free-queue-returns-blocks-to-the-head",
    "the-kernels-exp-has-a-wrong-coefficient",
)


@pytest.fixture(scope="session")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every selected bug's outcome, run on `NUM_COPIES` copies at once (see the module
    docstring), each copy taking the next bug from one shared list; and, under "control: NAME",
    the runs of `CONTROLS`' tests with no bug planted."""
    selected = [
        item.callspec.params["bug"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_the_suite_catches_the_planted_bug"
    ]
    by_name = {bug.name: bug for bug in PLANTED_BUGS}
    jobs: list[tuple[str, PlantedBug | None, tuple[str, ...]]] = [
        (f"control: {name}", None, by_name[name].tests) for name in CONTROLS
    ] + [(bug.name, bug, bug.tests) for bug in selected]
    todo = list(reversed(jobs))  # popped from the end: in the session's order
    results: dict[str, Outcome] = {}
    lock = threading.Lock()

    def worker(dest: Path) -> None:
        mirror(dest)
        with start_server(dest) as server:
            while True:
                with lock:
                    if not todo:
                        return
                    name, bug, tests = todo.pop()
                try:
                    if bug is None:
                        outcome = run_tests(tests, dest, server)
                    else:
                        outcome = plant_and_run(bug, dest, server)
                except Exception as exc:  # noqa: BLE001 - reported by the bug's own test
                    outcome = Outcome(-1, f"{type(exc).__name__}: {exc}")
                results[name] = outcome

    copies = [tmp_path_factory.mktemp("planted") for _ in range(min(NUM_COPIES, len(todo)))]
    threads = [threading.Thread(target=worker, args=(dest,)) for dest in copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# The quick tier plants one bug, to show the mechanism works; the full tier plants them all.
QUICK_BUG = "free-queue-returns-blocks-to-the-head"


# The first bug's test waits for the shared fixture, which runs every bug (270 s on a quiet
# 2-core machine): past pyproject's per-test limit on a loaded one.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "bug",
    [pytest.param(b, marks=pytest.mark.quick) if b.name == QUICK_BUG else b for b in PLANTED_BUGS],
    ids=lambda b: b.name,
)
def test_the_suite_catches_the_planted_bug(bug: PlantedBug, outcomes: dict) -> None:
    for name in CONTROLS:
        control = outcomes[f"control: {name}"]
        assert control.returncode == 0, f"{name}'s tests fail with no bug planted\n{control.tail}"
    run = outcomes[bug.name]
    assert run.returncode != 5, f"{bug.name}: {bug.tests} selected no test\n{run.tail}"
    assert run.returncode == 1, f"{bug.name} was not caught by {bug.tests} ({bug.why})\n{run.tail}"


# -- Planted bugs survive a reformat --------------------------------------------------------
# Each bug names its function and edits its normal form, so `ruff format` at any line length
# (or another indent width) must leave every bug plantable, and planting the same bug.

# The layouts the tree is reformatted to: other line lengths, and an indent of two spaces
# (which moves every function's body: the planted function is written back at its own depth).
LAYOUTS = {
    "line-length 79": ["--line-length", "79"],
    "line-length 120": ["--line-length", "120"],
    "indent 2, line-length 60": ["--line-length", "60", "--config", "indent-width = 2"],
}


def planted_function(source: str, bug: PlantedBug) -> str:
    """The normal form of `bug`'s function once planted in `source` (which must parse)."""
    return normal_form_of(plant(source, bug.function, bug.edits), bug.function)


@pytest.fixture(scope="module")
def reformatted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The repository's source folders, copied and `ruff format`-ted in each layout."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    trees = {}
    for layout, options in LAYOUTS.items():
        dest = tmp_path_factory.mktemp("reformatted")
        for folder in INSTALLED:
            shutil.copytree(
                ROOT / folder,
                dest / folder,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        run = subprocess.run(
            [ruff, "format", "--isolated", "--target-version", "py310", *options, str(dest)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        trees[layout] = dest
    return trees


@pytest.mark.quick
def test_every_planted_bug_survives_a_reformat(reformatted: dict[str, Path]) -> None:
    """Every bug finds its function and its old text once, in the tree as it is and in each
    reformatted copy; it changes the function's syntax tree; and each copy gets the same
    planted function as the tree itself. The reformats must have changed the files the bugs
    live in, or this would show nothing."""
    problems, unchanged = [], {layout: 0 for layout in LAYOUTS}
    for bug in PLANTED_BUGS:
        source = (ROOT / bug.file).read_text()
        try:
            want = planted_function(source, bug)
        except PlantError as exc:
            problems.append(f"{bug.name}: {exc}")
            continue
        for layout, dest in reformatted.items():
            copy = (dest / bug.file).read_text()
            unchanged[layout] += copy == source
            try:
                got = planted_function(copy, bug)
            except PlantError as exc:
                problems.append(f"{bug.name}, {layout}: {exc}")
                continue
            if got != want:
                problems.append(f"{bug.name}, {layout}: planted another function\n{got}")
    assert not problems, "\n\n".join(problems)
    assert all(count < len(PLANTED_BUGS) // 2 for count in unchanged.values()), unchanged


# -- The converter from the old form ---------------------------------------------------------
# tests/tools/convert_planted_bugs.py turns entries that edit a file's exact text into entries
# named by function. Here on a small module of its own, one entry per kind of place a bug can
# live, and the entries it must refuse.

CONVERTER_MODULE = '''"""A module."""

import functools

LIMIT = 4  # the limit


class Queue:
    """A queue.

    Its docstring's later lines are indented.
    """

    size: int = 3

    @functools.cache
    def push(self, x):
        items = [
            x,
            x + 1,
        ]  # a comment
        return items

    def pop(self):
        def helper(y):
            return y + 1

        return helper(1)


def free(a, b):
    if a:
        return b
    return a
'''
# name: (old-form edits, the function the converter must name; None: it must refuse)
CONVERTER_CASES = {
    "module-constant": ((("LIMIT = 4  # the limit", "LIMIT = 5"),), "LIMIT"),
    "class-attribute": ((("    size: int = 3", "    size: int = 2"),), "Queue.size"),
    "decorator": ((("    @functools.cache\n", ""),), "Queue.push"),
    "inside-a-wrapped-list": ((("            x + 1,\n", "            x + 2,\n"),), "Queue.push"),
    "nested-function": ((("            return y + 1\n", "            return y - 1\n"),), "Queue.pop.helper"),
    "two-methods": (
        (("            x + 1,\n", "            x + 2,\n"), ("            return y + 1\n", "            return y\n")),
        "Queue",
    ),
    "moved-line": ((("    if a:\n        return b\n    return a\n", "    return a\n    if a:\n        return b\n"),), "free"),
    "comment-only": ((("# a comment", "# another"),), None),
    "text-not-there": ((("nothing like this", "x"),), None),
    "two-functions": ((("LIMIT = 4", "LIMIT = 3"), ("    return a\n", "    return b\n")), None),
}  # fmt: skip


def test_the_converter_names_the_function_and_refuses_what_it_cannot_convert(
    tmp_path: Path,
) -> None:
    """Each convertible entry is rewritten to name the right function; planted the new way, in
    the module as it is and reformatted, it gives the module the old way's syntax tree. Each
    other entry is left as it was, and the exit status says so."""
    spec = importlib.util.spec_from_file_location(
        "convert", TESTS / "tools/convert_planted_bugs.py"
    )
    assert spec is not None and spec.loader is not None
    convert = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = convert  # its dataclass looks its module up there
    spec.loader.exec_module(convert)
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg/mod.py"
    module.write_text(CONVERTER_MODULE)
    entries = tmp_path / "entries.py"
    entries.write_text(
        "".join(
            f"PlantedBug({name!r}, 'pkg/mod.py', {edits!r}, ('tests/x.py',), 'why')\n"
            for name, (edits, _) in CONVERTER_CASES.items()
        )
    )
    assert convert.main(["--root", str(tmp_path), "--in-place", str(entries)]) == 1

    formatted = tmp_path / "formatted.py"
    formatted.write_text(CONVERTER_MODULE)
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    subprocess.run(
        [ruff, "format", "-q", "--isolated", "--line-length", "20", str(formatted)], check=True
    )
    for entry in convert.entries_in(ast.parse(entries.read_text())):
        name = entry.value("name")
        old_edits, function = CONVERTER_CASES[name]
        if function is None:
            assert entry.is_old and entry.value("edits") == old_edits, name
            continue
        assert not entry.is_old and entry.value("function") == function, name
        old_way = CONVERTER_MODULE
        for old, new in old_edits:
            old_way = old_way.replace(old, new)
        want = ast.dump(without_indented_docstrings(ast.parse(old_way)))
        for source in (CONVERTER_MODULE, formatted.read_text()):
            new_way = plant(source, function, entry.value("edits"))
            assert ast.dump(without_indented_docstrings(ast.parse(new_way))) == want, name
