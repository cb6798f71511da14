"""Finding the lessons: the `NN_topic/` folders beside this file, in order.

A lesson is identified by its folder name (`03_free_block_queue`), which is also the key of its
progress in the learner's workspace, so renumbering nothing and renaming nothing keeps progress
valid across upgrades. Users may name it by number (`3`, `03`) or by folder name.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

LESSONS_DIR = Path(__file__).resolve().parent
# Lessons whose exercise starts from the learner's solution of an earlier one:
# {lesson: (earlier lesson, the function copied from it)}. See `Workspace.seed_followers`.
STARTS_FROM: dict[str, tuple[str, str]] = {
    "07_preemption": ("06_continuous_batching", "schedule_step"),
    "09_chunked_prefill": ("06_continuous_batching", "schedule_step"),
}
_FOLDER = re.compile(r"^(\d\d)_([a-z0-9_]+)$")
_TIME = re.compile(r"\*\*Time:\*\*\s*(\d+)")


@dataclass(frozen=True)
class Lesson:
    number: int
    name: str  # the folder name, e.g. "03_free_block_queue"
    path: Path

    @property
    def readme(self) -> Path:
        return self.path / "README.md"

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def title(self) -> str:
        """The README's first heading, without its "NN ·" prefix."""
        for line in self.readme.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return re.sub(r"^\d+\s*[·:.-]\s*", "", line[2:].strip())
        return self.name

    @property
    def minutes(self) -> int | None:
        match = _TIME.search(self.readme.read_text(encoding="utf-8"))
        return int(match.group(1)) if match else None

    def __str__(self) -> str:
        return self.name


@cache
def all_lessons() -> tuple[Lesson, ...]:
    lessons = []
    for path in sorted(LESSONS_DIR.iterdir()):
        match = _FOLDER.match(path.name)
        if match and path.is_dir() and (path / "README.md").is_file():
            lessons.append(Lesson(int(match.group(1)), path.name, path))
    return tuple(lessons)


def get_lesson(key: str | int) -> Lesson:
    """The lesson named by number ("3", "03", 3) or folder name; ValueError when there is none."""
    text = str(key).strip()
    for lesson in all_lessons():
        if text == lesson.name or (text.isdigit() and int(text) == lesson.number):
            return lesson
    known = ", ".join(str(lesson.number) for lesson in all_lessons())
    raise ValueError(f"no lesson {key!r}; the lessons are {known}")


# --- loading a lesson's files ------------------------------------------------------------------

_modules: dict[tuple[str, str], ModuleType] = {}
_counter = itertools.count()


def load_file(path: Path, module_name: str | None = None) -> ModuleType:
    """Import the Python file at `path` as a module, registered in sys.modules under a unique name
    (dataclasses and pickling look modules up there)."""
    name = module_name or f"nanovllm_lesson_file_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def lesson_module(lesson: Lesson, stem: str) -> ModuleType:
    """One of a lesson's shipped files (`reference`, `exercise`, `mutants`, `test_exercise`,
    `demo`), loaded once per process."""
    key = (lesson.name, stem)
    if key not in _modules:
        _modules[key] = load_file(
            lesson.file(f"{stem}.py"), f"nanovllm_lesson_{lesson.name}_{stem}"
        )
    return _modules[key]
