"""The suite catches every planted bug of `planted_bugs.py`.

Each bug is planted in a copy of the package (a tree of links to the real files, with the one
edited file written out), and the tests named for it run against that copy in a subprocess, with
CI's hypothesis examples. They must fail. The same subprocess run without the bug must pass,
which the rest of the suite already shows.

One copy serves every bug of a test session: a bug swaps its edited file in and puts the link
back after. So what the copy's processes cache beside its files survives from bug to bug, numba's
compiled kernels above all (`cache=True` writes them to the copy's `__pycache__`); a fresh copy
per bug compiled them again for every bug that runs a kernel. Both swaps remove the file's
bytecode, so no bug ever runs another's (or the original's) stale `.pyc`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from planted_bugs import PLANTED_BUGS, PlantedBug

ROOT = Path(__file__).resolve().parent.parent
# Where each top-level folder of the repository lives once installed (setup.py's ROOTS).
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


def installed(dest: Path, file: str) -> Path:
    """Where the repository's `file` lies in the copy at `dest`."""
    folder = file.split("/")[0]
    return dest / INSTALLED[folder] / Path(file).relative_to(folder)


def forget_bytecode(path: Path) -> None:
    """Remove `path`'s cached bytecode: a swap within one second, to a file of the same size,
    would otherwise look unchanged to Python (a .pyc records the source's mtime in seconds)."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


@contextmanager
def planted(bug: PlantedBug, dest: Path) -> Iterator[None]:
    """The copy at `dest` with `bug` planted in it for the duration; then the link again."""
    source = (ROOT / bug.file).read_text()
    for old, new in bug.edits:
        count = source.count(old)
        assert count == 1, (
            f"{bug.name}: the text to edit occurs {count} times in {bug.file} (expected once); "
            "rewrite the planted bug for the current code"
        )
        source = source.replace(old, new)
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


@pytest.fixture(scope="session")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the package for every planted bug of the session (see the module docstring)."""
    dest = tmp_path_factory.mktemp("planted")
    mirror(dest)
    return dest


# The quick tier plants one bug, to show the mechanism works; the full tier plants them all.
QUICK_BUG = "free-queue-returns-blocks-to-the-head"


@pytest.mark.parametrize(
    "bug",
    [pytest.param(b, marks=pytest.mark.quick) if b.name == QUICK_BUG else b for b in PLANTED_BUGS],
    ids=lambda b: b.name,
)
def test_the_suite_catches_the_planted_bug(bug: PlantedBug, package_copy: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(package_copy), HYPOTHESIS_PROFILE="planted")
    with planted(bug, package_copy):
        # Run from the copy's folder: Python puts the working directory first on sys.path, and
        # the repository's own `nanovllm/` there would shadow the copy.
        where = subprocess.run(
            [sys.executable, "-c", "import nanovllm; print(nanovllm.__file__)"],
            cwd=package_copy, env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert where.startswith(str(package_copy)), f"the copy was not imported: {where}"
        args = [str(ROOT / a) if a.startswith("tests/") else a for a in bug.tests]
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args],
            cwd=package_copy, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    tail = run.stdout[-1500:] + run.stderr[-500:]
    assert run.returncode != 5, f"{bug.name}: {bug.tests} selected no test\n{tail}"
    assert run.returncode == 1, f"{bug.name} was not caught by {bug.tests} ({bug.why})\n{tail}"
