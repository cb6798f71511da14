"""Calling an implementation in other Python processes, to see that it answers the same there.

Some answers must not depend on the process that computes them: a block hash (lesson 08) names
a block's contents for as long as the prefix cache lives, and in vLLM across processes too (a
KV connector finds another engine's blocks by hash). Python's own `hash()` of a str, bytes or
tuple holding them is salted per process (`PYTHONHASHSEED`), as `id()` and set order are, so a
hash built on them is the same in every call of one process, and only another process shows it
differs. `call_elsewhere` rebuilds the implementation under test in a fresh interpreter with a
given `PYTHONHASHSEED`, makes the same calls, and brings the answers back.

The implementation is rebuilt from what it is: a file (the learner's, or a lesson's reference:
a module with `__file__`), or a planted bug (`harness.planted` marks it `__lesson_mutant__`).
Anything else cannot be rebuilt, and `call_elsewhere` returns None.

Run as `python -m nanovllm.lessons.processes`, it is the other process: it reads the pickled
recipe and calls from stdin and writes the pickled answers to stdout.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

CALL_TIMEOUT_S = 120.0  # a fresh interpreter imports the engine's parts: seconds on a busy CPU

Call = tuple[str, tuple[Any, ...]]  # (public name, positional arguments)


def recipe(impl: Any) -> tuple[str, ...] | None:
    """How another process builds `impl` again, or None if it cannot."""
    mutant = getattr(impl, "__lesson_mutant__", None)
    if mutant is not None:
        return ("mutant", *mutant)
    if isinstance(impl, ModuleType) and getattr(impl, "__file__", None):
        return ("file", str(Path(impl.__file__).resolve()))
    return None


def call_elsewhere(impl: Any, calls: list[Call], hash_seeds: tuple[int, ...]) -> list[list[Any]]:
    """The answers of `calls` (each `impl.<name>(*args)`), made in one fresh process per seed
    in `hash_seeds` (its `PYTHONHASHSEED`), the processes running side by side: one list of
    answers per seed. RuntimeError, with the other process's error, if one fails."""
    how = recipe(impl)
    if how is None:
        raise LookupError(f"{impl!r} cannot be built again in another process")
    payload = pickle.dumps((how, calls))
    runs = []
    for seed in hash_seeds:
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": "1"}
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "nanovllm.lessons.processes"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        )
    answers = []
    for seed, run in zip(hash_seeds, runs):
        try:
            out, err = run.communicate(payload, timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()
            raise RuntimeError(
                f"the process with PYTHONHASHSEED={seed} ran past {CALL_TIMEOUT_S:g} s"
            ) from None
        if run.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
            raise RuntimeError(f"in a process with PYTHONHASHSEED={seed}: {last[0]}")
        answers.append(pickle.loads(out))
    return answers


def rebuild(how: tuple[str, ...]) -> Any:
    """The implementation `recipe` described."""
    from nanovllm.lessons import harness
    from nanovllm.lessons.catalog import get_lesson, load_file

    if how[0] == "file":
        return load_file(Path(how[1]))
    _, lesson_name, mutant_name = how
    lesson = get_lesson(lesson_name)
    mutant = next(m for m in harness.mutants(lesson) if m.name == mutant_name)
    return harness.planted(lesson, mutant)


def _main() -> None:
    how, calls = pickle.loads(sys.stdin.buffer.read())
    impl = rebuild(how)
    answers = [getattr(impl, name)(*args) for name, args in calls]
    sys.stdout.buffer.write(pickle.dumps(answers))


if __name__ == "__main__":
    _main()
