"""The learner's workspace: their copies of the exercises and their progress, outside the package.

The package is replaced on every upgrade, so nothing the learner writes may live in it. On first
use each lesson's `exercise.py` is copied to

    $NANOVLLM_HOME/lessons/NN_topic/exercise.py      (NANOVLLM_HOME defaults to ~/.nanovllm)

and the learner edits that copy. A copy that exists is never overwritten, not even by an upgrade
that changes the shipped exercise; a lesson added by an upgrade gets its copy on the next run.
Progress (lessons passed, hints seen, the lesson last opened) is one JSON file beside them,
written atomically (write a temporary file, then rename) so an interrupted run cannot corrupt it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nanovllm.lessons.catalog import Lesson, all_lessons

HOME_ENV = "NANOVLLM_HOME"
PROGRESS_VERSION = 1


def home() -> Path:
    """The root of everything nanovllm keeps for the user: $NANOVLLM_HOME, else ~/.nanovllm."""
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else Path.home() / ".nanovllm"


@dataclass
class Progress:
    passed: dict[str, str] = field(default_factory=dict)  # lesson name -> when it first passed
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

    def ensure(self, lessons: tuple[Lesson, ...] | None = None) -> list[Lesson]:
        """Copy every missing exercise into the workspace; return the lessons that got a copy."""
        copied = []
        for lesson in all_lessons() if lessons is None else lessons:
            target = self.exercise_path(lesson)
            if target.exists():
                continue  # the learner's copy: never overwritten
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lesson.file("exercise.py"), target)  # content only: stays writable
            copied.append(lesson)
        return copied

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

    def mark_passed(self, lesson: Lesson) -> None:
        progress = self.load_progress()
        progress.passed.setdefault(
            lesson.name, datetime.now(timezone.utc).isoformat(timespec="seconds")
        )
        progress.last = lesson.name
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
