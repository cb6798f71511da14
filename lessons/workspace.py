"""The learner's workspace: their copies of the exercises and their progress, outside the package.

The package is replaced on every upgrade, so nothing the learner writes may live in it. On first
use each lesson's `exercise.py` is copied to

    $NANOVLLM_HOME/lessons/NN_topic/exercise.py      (NANOVLLM_HOME defaults to ~/.nanovllm)

and the learner edits that copy. A copy that exists is never overwritten, not even by an upgrade
that changes the shipped exercise; a lesson added by an upgrade gets its copy on the next run.
Two exceptions, both asked for:

- `nanovllm lesson N --reset` puts the starting copy back (the learner's version is kept beside
  it as `exercise.py.bak`) and forgets the failing examples saved for that lesson;
- a lesson that starts from an earlier one (`catalog.STARTS_FROM`: lessons 07 and 09 start from
  your lesson 06 `schedule_step`) gets your code copied in when you pass the earlier lesson, but
  only while its copy is still untouched.

Also kept here, per lesson: `.hypothesis/`, the failing examples `--check` saved (tried first
next time). Progress (lessons passed, hints seen, the lesson last opened) is one JSON file beside
them, written atomically (write a temporary file, then rename) so an interrupted run cannot
corrupt it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nanovllm.lessons.catalog import STARTS_FROM, Lesson, all_lessons, get_lesson

HOME_ENV = "NANOVLLM_HOME"
PROGRESS_VERSION = 1


def home() -> Path:
    """The root of everything nanovllm keeps for the user: $NANOVLLM_HOME, else ~/.nanovllm."""
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else Path.home() / ".nanovllm"


@dataclass
class Progress:
    # lesson name -> when it first passed (since it last failed a check)
    passed: dict[str, str] = field(default_factory=dict)
    hints_seen: dict[str, int] = field(default_factory=dict)  # lesson name -> hints shown
    last: str | None = None  # the lesson last opened or checked

    def to_json(self) -> dict:
        return {
            "version": PROGRESS_VERSION,
            "passed": self.passed,
            "hints_seen": self.hints_seen,
            "last": self.last,
        }

    @classmethod
    def from_json(cls, data: dict) -> Progress:
        return cls(
            passed=dict(data.get("passed") or {}),
            hints_seen={k: int(v) for k, v in (data.get("hints_seen") or {}).items()},
            last=data.get("last"),
        )


class Workspace:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else home() / "lessons"
        self.progress_file = self.root / "progress.json"

    # --- exercise copies ---------------------------------------------------------------------

    def exercise_path(self, lesson: Lesson) -> Path:
        return self.root / lesson.name / "exercise.py"

    def database_dir(self, lesson: Lesson) -> Path:
        """Where `--check` saves the lesson's failing examples (hypothesis' example database)."""
        return self.root / lesson.name / ".hypothesis"

    def storage_dir(self) -> Path:
        """hypothesis' own storage (Unicode caches), kept out of the learner's current folder."""
        return self.root / ".hypothesis"

    def ensure(self, lessons: tuple[Lesson, ...] | None = None) -> list[Lesson]:
        """Copy every missing exercise into the workspace; return the lessons that got a copy."""
        copied = []
        for lesson in all_lessons() if lessons is None else lessons:
            target = self.exercise_path(lesson)
            if target.exists():
                continue  # the learner's copy: never overwritten
            self._write_copy(lesson, self.starting_copy(lesson))
            copied.append(lesson)
        return copied

    def starting_copy(self, lesson: Lesson) -> str:
        """What the lesson's exercise starts as: the shipped file, or, for a lesson that starts
        from an earlier one the learner has passed, the shipped file with their code in it."""
        shipped = lesson.file("exercise.py").read_text(encoding="utf-8")
        source = STARTS_FROM.get(lesson.name)
        if source is None:
            return shipped
        earlier, function = source
        if earlier not in self.load_progress().passed:
            return shipped
        mine = self.exercise_path(get_lesson(earlier))
        try:
            return seed_exercise(shipped, mine.read_text(encoding="utf-8"), function, earlier)
        except (OSError, SyntaxError, ValueError):
            return shipped  # their earlier file is gone or unreadable: start from the stub

    def reset(self, lesson: Lesson) -> Path | None:
        """Put the starting copy back and forget the saved failing examples. Returns where the
        learner's previous version was kept (None if it was the starting copy already)."""
        target = self.exercise_path(lesson)
        fresh = self.starting_copy(lesson)
        backup = None
        if target.exists() and target.read_text(encoding="utf-8") != fresh:
            backup = target.with_name("exercise.py.bak")
            shutil.copyfile(target, backup)
        self._write_copy(lesson, fresh)
        shutil.rmtree(self.database_dir(lesson), ignore_errors=True)
        return backup

    def seed_followers(self, lesson: Lesson) -> list[Lesson]:
        """After `lesson` is passed: give the lessons that start from it the learner's code, if
        their copies are still exactly as shipped. Returns those lessons."""
        seeded = []
        for follower in all_lessons():
            if STARTS_FROM.get(follower.name, ("",))[0] != lesson.name:
                continue
            target = self.exercise_path(follower)
            shipped = follower.file("exercise.py").read_text(encoding="utf-8")
            if target.exists() and target.read_text(encoding="utf-8") != shipped:
                continue  # the learner has started on it: never overwritten
            fresh = self.starting_copy(follower)
            if fresh != shipped:
                self._write_copy(follower, fresh)
                seeded.append(follower)
        return seeded

    def _write_copy(self, lesson: Lesson, text: str) -> None:
        target = self.exercise_path(lesson)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")

    # --- progress ------------------------------------------------------------------------------

    def load_progress(self) -> Progress:
        try:
            data = json.loads(self.progress_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Progress()
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            # A damaged file must not lock the learner out: keep it aside and start afresh.
            self.progress_file.replace(self.progress_file.with_suffix(".json.bad"))
            return Progress()
        return Progress.from_json(data if isinstance(data, dict) else {})

    def save_progress(self, progress: Progress) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".progress-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(progress.to_json(), f, indent=2, sort_keys=True)
        os.replace(tmp, self.progress_file)

    def mark_passed(self, lesson: Lesson) -> list[Lesson]:
        """Record a pass; returns the later lessons that now start from this one's code."""
        progress = self.load_progress()
        progress.passed.setdefault(
            lesson.name, datetime.now(timezone.utc).isoformat(timespec="seconds")
        )
        progress.last = lesson.name
        self.save_progress(progress)
        return self.seed_followers(lesson)

    def forget_pass(self, lesson: Lesson) -> None:
        """Record that `lesson`'s exercise fails its check now: it is not listed as passed until
        it passes again."""
        progress = self.load_progress()
        if progress.passed.pop(lesson.name, None) is not None:
            self.save_progress(progress)

    def mark_opened(self, lesson: Lesson) -> None:
        progress = self.load_progress()
        progress.last = lesson.name
        self.save_progress(progress)

    def next_hint(self, lesson: Lesson) -> int:
        """Count one more hint seen for `lesson`; return its 1-based number."""
        progress = self.load_progress()
        n = progress.hints_seen.get(lesson.name, 0) + 1
        progress.hints_seen[lesson.name] = n
        progress.last = lesson.name
        self.save_progress(progress)
        return n

    def next_lesson(self) -> Lesson | None:
        """Where to carry on: the lesson last opened if it is not passed yet, else the first
        unpassed lesson after it, else the first unpassed one at all; None when all are passed."""
        progress = self.load_progress()
        lessons = all_lessons()
        unpassed = [lesson for lesson in lessons if lesson.name not in progress.passed]
        if not unpassed:
            return None
        last = next((lesson for lesson in lessons if lesson.name == progress.last), None)
        if last is not None:
            if last.name not in progress.passed:
                return last
            later = [lesson for lesson in unpassed if lesson.number > last.number]
            if later:
                return later[0]
        return unpassed[0]


def seed_exercise(shipped: str, earlier: str, function: str, earlier_name: str) -> str:
    """`shipped` with the stub of `function` replaced by the body of `function` from the
    learner's `earlier` file, under a comment that says where it comes from.

    The stub is the line `raise NotImplementedError("write <function> ...")`; the body is the
    learner's code without its docstring. ValueError if either is missing.
    """
    tree = ast.parse(earlier)
    node = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None
    )
    if node is None:
        raise ValueError(f"no function {function} in the earlier exercise")
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        raise ValueError(f"{function} has no body")
    lines = earlier.splitlines()
    code = textwrap.dedent("\n".join(lines[body[0].lineno - 1 : node.end_lineno]))
    if "NotImplementedError" in code:
        raise ValueError(f"{function} is still the stub")
    stub = re.compile(
        rf"^([ \t]*)raise NotImplementedError\(\"write {re.escape(function)}\b[^\n]*$", re.M
    )
    match = stub.search(shipped)
    if match is None:
        raise ValueError(f"no stub for {function} in the exercise")
    indent = match.group(1)
    header = (
        f"# Your {function} from lesson {earlier_name[:2]}, copied here to start from: it does\n"
        "# not know this lesson's new rule yet. (`--reset` brings this starting point back.)\n"
    )
    block = textwrap.indent(header + code, indent)
    return shipped[: match.start()] + block + shipped[match.end() :]
