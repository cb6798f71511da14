"""The suite catches every planted bug of `planted_bugs.py`.

Each bug is planted in a copy of the package (a tree of links to the real files, with the one
edited file written out), and the tests named for it run against that copy in a subprocess, with
CI's hypothesis examples. They must fail. The same subprocess run without the bug must pass,
which the rest of the suite already shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def plant(bug: PlantedBug, dest: Path) -> None:
    source = (ROOT / bug.file).read_text()
    for old, new in bug.edits:
        count = source.count(old)
        assert count == 1, (
            f"{bug.name}: the text to edit occurs {count} times in {bug.file} (expected once); "
            "rewrite the planted bug for the current code"
        )
        source = source.replace(old, new)
    folder = bug.file.split("/")[0]
    target = dest / INSTALLED[folder] / Path(bug.file).relative_to(folder)
    target.unlink()
    target.write_text(source)


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=lambda b: b.name)
def test_the_suite_catches_the_planted_bug(bug: PlantedBug, tmp_path) -> None:
    mirror(tmp_path)
    plant(bug, tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HYPOTHESIS_PROFILE="planted")
    # Run from the copy's folder: Python puts the working directory first on sys.path, and the
    # repository's own `nanovllm/` there would shadow the copy.
    where = subprocess.run(
        [sys.executable, "-c", "import nanovllm; print(nanovllm.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(tmp_path)), f"the copy was not imported: {where}"
    args = [str(ROOT / a) if a.startswith("tests/") else a for a in bug.tests]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = run.stdout[-1500:] + run.stderr[-500:]
    assert run.returncode != 5, f"{bug.name}: {bug.tests} selected no test\n{tail}"
    assert run.returncode == 1, f"{bug.name} was not caught by {bug.tests} ({bug.why})\n{tail}"
