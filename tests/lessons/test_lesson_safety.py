"""What no learner's code can do to the course (issue 32): hang a check, eat the memory, be
shown as running right by `--run` while it fails `--check`, or get a report that points at the
wrong code; and what the first install brings (the checks' tools).

A learner is simulated by `solutions.solve`, with one line of the worked solution changed into
the wrong one (`_wrong`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.core.free_block_queue import FreeBlockQueue, KVCacheBlock
from nanovllm.lessons import compare, harness, testing, your_engine
from nanovllm.lessons.catalog import all_lessons, get_lesson
from nanovllm.lessons.testing import walk_free_list

sys.path.insert(0, str(Path(__file__).parent))  # for `solutions`
from commands_ahead import CommandsAhead  # noqa: E402
from solutions import solve  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _cli(*argv: str) -> int:
    from nanovllm.lessons.cli import main

    return main(list(argv))


def _wrong(number: int, folder: Path, *changes: tuple[str, str]) -> Path:
    """The worked solution of lesson `number` in `folder`, with each (old, new) of `changes`
    made: `old` must occur exactly once, and `new` takes its place (continuation lines of `new`
    carry their own indentation)."""
    path = solve(get_lesson(number), folder)
    source = path.read_text()
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} occurs {source.count(old)} times in the solution"
        source = source.replace(old, new)
    path.write_text(source)
    return path


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


# --- the first install --------------------------------------------------------------------------


def test_the_checks_tools_are_dependencies_of_the_package():
    """`pip install -e .` alone lets `--check` run: pytest and hypothesis are in the package's
    own dependencies, not only in an extra."""
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    listed = text[
        text.index("\ndependencies = [") : text.index("\n]", text.index("\ndependencies"))
    ]
    names = set(re.findall(r'^\s*"([A-Za-z0-9_.-]+)', listed, flags=re.MULTILINE))
    assert {"pytest", "hypothesis"} <= names, sorted(names)


def test_a_missing_tool_is_named_with_the_clone_install(home, capsys, monkeypatch):
    """Were they missing, the hint names them and the install from the clone (with nothing
    eaten by Rich's markup)."""
    from nanovllm.lessons import cli

    monkeypatch.setattr(cli, "missing_test_tools", lambda: ["pytest", "hypothesis"])
    assert _cli("2", "--check") == 2
    out = _flat(capsys.readouterr().out)
    assert "This needs pytest and hypothesis" in out
    assert "pip install -e ." in out, out


# --- no walk without end ------------------------------------------------------------------------


@st.composite
def linked_lists(draw) -> tuple[KVCacheBlock, KVCacheBlock, list[KVCacheBlock]]:
    """A head, a tail and 0-6 blocks, each link (head's next and every block's) pointing at any
    block, the tail or None."""
    blocks = [KVCacheBlock(i) for i in range(draw(st.integers(0, 6)))]
    head, tail = KVCacheBlock(-1), KVCacheBlock(-1)
    targets = [*blocks, tail, None]
    for block in [head, *blocks]:
        block.next_free = draw(st.sampled_from(targets))
    return head, tail, blocks


@given(linked_lists())
def test_walking_any_list_ends_and_says_why_it_stopped(case):
    """Oracle: following the links by hand. A list that reaches the tail is walked in full; one
    that comes back to a block names that block as the cycle's; one that ends in None says so."""
    head, tail, blocks = case
    path, block = [], head.next_free
    while block is not tail and block is not None and block not in path:
        path.append(block)
        block = block.next_free
    if block is tail:
        assert walk_free_list(head, tail, len(blocks)) == path
        return
    with pytest.raises(AssertionError) as failure:
        walk_free_list(head, tail, len(blocks))
    if block is None:
        assert "ends before its tail" in str(failure.value)
    else:
        assert f"a cycle through block {block.block_id}:" in str(failure.value)


def test_the_engine_walks_your_free_list_boundedly():
    """`--run`'s queue (`plug.BoundedFreeBlockQueue`): a learner's list with a cycle is a
    LessonRunError naming the block, in the walks the engine makes each step."""
    from nanovllm.lessons.plug import BoundedFreeBlockQueue, LessonRunError

    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = BoundedFreeBlockQueue(FreeBlockQueue(blocks), blocks)
    assert queue.peek(2) == [0, 1] and queue.num_free_blocks == 4
    queue.popleft()
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 2, 3]
    blocks[2].next_free = blocks[1]  # a cycle: 1 -> 2 -> 1
    with pytest.raises(LessonRunError, match="cycle through block 1"):
        queue.peek(8)


def test_the_engine_calls_your_get_all_free_blocks_and_checks_it():
    """`get_all_free_blocks` is the learner's too (the engine's reset of the prefix cache and
    its step summary call it), checked against the list's links: one that skips the head is a
    LessonRunError that says which blocks it listed."""
    from nanovllm.lessons.plug import BoundedFreeBlockQueue, LessonRunError

    class SkipsTheHead(FreeBlockQueue):
        def get_all_free_blocks(self):
            return super().get_all_free_blocks()[1:]

    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = BoundedFreeBlockQueue(SkipsTheHead(blocks), blocks)
    with pytest.raises(LessonRunError, match=r"get_all_free_blocks lists \[1, 2, 3\] \(3 blocks\)"):
        queue.get_all_free_blocks()


def _check_in_a_process(
    home: Path,
    number: int,
    deadline: float | None = None,
    *options: str,
    load_deadline: float | None = None,
) -> str:
    """`nanovllm lesson N --check [options]` in a process of its own, which must end within
    120 s (with each example's deadline set to `deadline`, and loading's to `load_deadline`,
    if given)."""
    code = "from nanovllm.lessons import harness\n"
    if deadline is not None:
        code += f"harness.EXAMPLE_DEADLINE_S = {deadline}\n"
    if load_deadline is not None:
        code += f"harness.LOAD_DEADLINE_S = {load_deadline}\n"
    argv = [str(number), "--check", *options]
    code += f"from nanovllm.lessons.cli import main\nraise SystemExit(main({argv!r}))\n"
    env = {**os.environ, "NANOVLLM_HOME": str(home), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return _flat(done.stdout)


def test_an_append_that_links_a_block_to_itself_is_a_cycle_not_a_hang(home):
    """Lesson 3: `append` making the block its own next. The check ends at once with the cycle
    named (it once walked the list for ever, gigabytes in a minute)."""
    _wrong(3, home / "lessons", ("block.next_free = self._tail", "block.next_free = block"))
    out = _check_in_a_process(home, 3)
    assert "your free list has a cycle through block" in out, out
    assert "Not yet" in out


def test_a_loop_that_never_ends_is_stopped_at_the_deadline(home):
    """A learner's `while True` is stopped at the example's deadline, and the report says so
    and where it was."""
    _wrong(
        2,
        home / "lessons",
        (
            "return (num_tokens + block_size - 1) // block_size",
            "while num_tokens >= 0:\n        num_tokens += 0",
        ),
    )
    start = time.monotonic()
    out = _check_in_a_process(home, 2, deadline=1.0)
    assert "This example ran past its deadline of 1 s and was stopped" in out, out
    assert "in your exercise.py, line" in out and "in blocks_needed" in out
    assert time.monotonic() - start < 60


def test_a_loop_at_the_top_of_the_file_is_stopped_while_it_loads(home):
    """A `while True` outside any function runs as the file is loaded: loading has a deadline
    too, and the report names the file's line."""
    path = solve(get_lesson(2), home / "lessons")
    source = path.read_text()
    path.write_text(source + "\nwhile True:\n    pass\n")
    start = time.monotonic()
    out = _check_in_a_process(home, 2, load_deadline=1.0)
    assert "exercise.py does not load: TimeoutError: loading it ran past its deadline of 1 s" in out
    loop = source.count("\n") + 2  # the `while` line; `pass` is the next
    assert any(f"(exercise.py, line {n}, in <module>)" in out for n in (loop, loop + 1)), out
    assert time.monotonic() - start < 60


def test_the_full_check_has_the_deadline_too(home):
    """`--check --full` (through pytest) stops the same loop at the same deadline."""
    _wrong(
        2,
        home / "lessons",
        (
            "return (num_tokens + block_size - 1) // block_size",
            "while num_tokens >= 0:\n        num_tokens += 0",
        ),
    )
    out = _check_in_a_process(home, 2, 1.0, "--full")
    assert "ExampleTimeout" in out and "deadline of 1 s" in out, out


@pytest.mark.parametrize("allocation", ["bytearray(1 << 60)", "__import__('torch').empty(1 << 50)"])
def test_a_huge_allocation_gets_a_plain_message(allocation, home, capsys):
    _wrong(
        2,
        home / "lessons",
        ("return (num_tokens + block_size - 1) // block_size", f"return len({allocation})"),
    )
    assert _cli("2", "--check") == 1
    out = _flat(capsys.readouterr().out)
    assert "your code asked for more memory than this machine has" in out, out


def test_a_huge_allocation_as_the_file_loads_gets_a_plain_message(home, capsys):
    path = solve(get_lesson(2), home / "lessons")
    path.write_text(path.read_text() + "\nBUFFER = bytearray(1 << 60)\n")
    assert _cli("2", "--check") == 1
    out = _flat(capsys.readouterr().out)
    assert "does not load: MemoryError: your code asked for more memory than this" in out, out


def test_a_deadline_stops_the_block_and_puts_an_earlier_timer_back():
    import signal

    signal.setitimer(signal.ITIMER_REAL, 100.0)
    handler = signal.getsignal(signal.SIGALRM)
    try:
        with pytest.raises(harness.ExampleTimeout):
            with harness.deadline(0.2):
                while True:
                    pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left < 100, "the earlier timer is set again, less the time spent"
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# --- `--run` never blesses wrong code ---------------------------------------------------------

SHORTER_AHEAD_OF_THE_HEAD = (
    ("if waiting[0].num_tokens > budget:", "if min(w.num_tokens for w in waiting) > budget:"),
    (
        "r = waiting.pop(0)",
        "r = waiting.pop(min(range(len(waiting)), key=lambda i: waiting[i].num_tokens))",
    ),
)

ONE_BLOCK_TOO_MANY = (
    ("return (num_tokens + block_size - 1) // block_size", "return num_tokens // block_size + 1"),
)

WRONG_FOR_RUN = [
    # lesson 6: taking a shorter request ahead of the queue's head; one token for every request
    (6, "shorter-ahead-of-the-head", SHORTER_AHEAD_OF_THE_HEAD),
    (6, "one-token-each", (("scheduled[r.id] = min(r.remaining, budget)", "scheduled[r.id] = 1"),)),
    # lesson 3: no double-free check; popleft not counting
    (
        3,
        "no-double-free-check",
        (("if block.prev_free is not None or block.next_free is not None:", "if False:"),),
    ),
    (
        3,
        "popleft-not-counting",
        (
            (
                "self.remove(block)",
                "self._head.next_free, block.next_free.prev_free = block.next_free, self._head\n"
                "        block.prev_free = block.next_free = None",
            ),
        ),
    ),
    # lesson 2: one block too many
    (2, "n-over-bs-plus-one", ONE_BLOCK_TOO_MANY),
    # lesson 15: the host tier evicts its most recently used entry; its clear forgets the held
    # slots (they are neither free nor held after it)
    (15, "evicts-mru", (("for old in self.slot_of:", "for old in reversed(self.slot_of):"),)),
    (
        15,
        "clear-forgets-the-held-slots",
        (("self.free_slots = list(range(self.num_blocks))", "pass"),),
    ),
    # lesson 8: a block hash of the tokens' digits run together ([1, 23] and [12, 3] alike); one
    # built on Python's hash(), salted per process
    (
        8,
        "digits-joined",
        (
            (
                'digest.update(int(t).to_bytes(8, "little", signed=True))',
                "digest.update(str(t).encode())",
            ),
        ),
    ),
    (
        8,
        "salted-hash",
        (
            (
                "return digest.digest()",
                "return hashlib.sha256(str(hash((parent_hash, tuple(token_ids)))).encode()).digest()",
            ),
        ),
    ),
    # lesson 13: three rules of sampled verification
    (13, "accepts-without-q", (("if u * q_x < float(p[x]):", "if u < float(p[x]):"),)),
    (
        13,
        "residual-is-p",
        (("residual = (p - draft_probs[i]).clamp(min=0)", "residual = p.clone()"),),
    ),
    (
        13,
        "bonus-from-the-last-proposal",
        (
            (
                "bonus = target_probs[len(draft_token_ids)]",
                "bonus = target_probs[len(draft_token_ids) - 1]",
            ),
        ),
    ),
    # Functions `--run` once never called (issue 40): lesson 1's KVCache and decode_step, lesson
    # 2's slot_for, lesson 8's hash_block_tokens, lesson 15's remove
    (
        1,
        "kv-append-values-first",
        (
            (
                "self.values = torch.cat([self.values, v])",
                "self.values = torch.cat([v, self.values])",
            ),
        ),
    ),
    (
        1,
        "decode-step-counts-the-new-token-twice",
        (
            (
                "return attention(q, cache.keys, cache.values, scale)",
                "return attention(q, torch.cat([cache.keys, k]), torch.cat([cache.values, v]), scale)",
            ),
        ),
    ),
    # (slot_mapping and block_hashes written without slot_for and hash_block_tokens, so only
    # the run's own calls of these two can show them)
    (
        2,
        "slot-for-alone-ignores-the-block-table",
        (
            (
                "return block_table[logical] * block_size + offset",
                "return logical * block_size + offset",
            ),
            (
                "return [slot_for(block_table, p, block_size) for p in range(start, end)]",
                "return [block_table[p // block_size] * block_size + p % block_size"
                " for p in range(start, end)]",
            ),
        ),
    ),
    (
        8,
        "hash-alone-ignores-the-parent",
        (
            (
                'digest = hashlib.sha256(parent_hash or b"\\0" * 32)',
                'digest = hashlib.sha256(b"\\0" * 32)',
            ),
            ("parent = hash_block_tokens(parent, token_ids", "parent = _chained(parent, token_ids"),
            (
                "def block_hashes(",
                "def _chained(parent_hash, token_ids):\n"
                '    digest = hashlib.sha256(parent_hash or b"\\0" * 32)\n'
                "    for t in token_ids:\n"
                '        digest.update(int(t).to_bytes(8, "little", signed=True))\n'
                "    return digest.digest()\n\n\n"
                "def block_hashes(",
            ),
        ),
    ),
    (
        15,
        "remove-keeps-the-slot",
        (
            (
                "self.free_slots.append(self.slot_of.pop(block_hash))",
                "self.slot_of.pop(block_hash)",
            ),
        ),
    ),
    (
        15,
        "remove-pops-the-lru",
        (
            (
                "self.free_slots.append(self.slot_of.pop(block_hash))",
                "self.free_slots.append(self.slot_of.popitem(last=False)[1])",
            ),
        ),
    ),
]


@pytest.mark.parametrize(
    "number,name,changes", WRONG_FOR_RUN, ids=[f"{n:02d}-{name}" for n, name, _ in WRONG_FOR_RUN]
)
def test_run_never_shows_code_that_fails_its_check_as_a_success(
    number, name, changes, home, capsys
):
    """`--run` checks first: a wrong solution (each once shown by `--run` as producing the
    stock engine's completions) is stopped there, said plainly, and not recorded as passed."""
    _wrong(number, home / "lessons", *changes)
    assert _cli(str(number), "--run") == 1
    out = _flat(capsys.readouterr().out)
    assert "✗ Not run in the engine: your code fails" in out, out
    assert "Your engine produced the same" not in out
    progress = home / "lessons" / "progress.json"
    if progress.is_file():
        assert get_lesson(number).name not in json.loads(progress.read_text()).get("passed", {})


def test_a_lesson_that_fails_its_check_again_is_no_longer_listed_as_passed(home, capsys):
    """Passed, then broken: `--check` (or `--run`, which checks first) takes the pass back, so
    the course list never says "passed" for code that fails its check."""
    lesson = get_lesson(2)
    solve(lesson, home / "lessons")
    assert _cli("2", "--check") == 0
    total = len(all_lessons())
    assert _cli() == 0 and f"1/{total} passed" in capsys.readouterr().out
    for act in ("--check", "--run"):
        _wrong(2, home / "lessons", *ONE_BLOCK_TOO_MANY)
        assert _cli("2", act) == 1
        assert _cli() == 0 and f"0/{total} passed" in capsys.readouterr().out
        solve(lesson, home / "lessons")
        assert _cli("2", "--check") == 0


# --- `--run` shows what the engine can, even unchecked -----------------------------------------

# What `nanovllm lesson N --run` says of each wrong solution when it is not checked first
# (`--unchecked`, the course's own option): the first step at which the learner's engine decides
# otherwise, in words, or the verification that rejection sampling could not have emitted.
SHOWN_BY_THE_ENGINE = {
    "shorter-ahead-of-the-head": (
        "every step's scheduling decisions differ, first at step 1:",
        "r0: the stock scheduler gave it 19 tokens; yours did not run it",
        "the stock scheduler ran 10 requests, 246 tokens (r0, r1, r2, r3, r4, r5, r6, r7, ...); "
        "yours ran 16 requests, 243 tokens (r24, r11, r13, r3,",
    ),
    "one-token-each": (
        "every step's scheduling decisions differ, first at step 2:",
        "r4: the stock scheduler gave it 5 tokens, yours 1 token",
    ),
    "no-double-free-check": (
        "what the queue does with a double free and with a block it does not hold differs, after the run:",
        "the stock engine: freeing block 0 again (a double free): refused with a ValueError",
        "yours: freeing block 0 again (a double free): done, not refused; then it counts 49",
    ),
    "popleft-not-counting": (
        "differ, first at step 1:",
        "the free block queue then counted 32 free blocks in the stock engine, 48 in yours",
    ),
    "n-over-bs-plus-one": (
        "differ, first at step 1:",
        "r1 was handed blocks 2, 3 in the stock engine, blocks 2, 3, 4 in yours",
        "r1 then held 2 blocks in the stock engine, 3 in yours (it had 32 tokens after the step)",
    ),
    "clear-forgets-the-held-slots": (
        "Your engine stopped",
        "returned None, but the tier has a free slot",
    ),
    "evicts-mru": (
        "every block saved to the host tier, dropped from it and loaded back differ, first at "
        "step 30:",
        "only in the stock engine: a0e3fee831c9 dropped from the tier",
    ),
    "residual-is-p": ("Your engine stopped", "yet emitted that very token there"),
    "bonus-from-the-last-proposal": ("Your engine stopped", "(the bonus), has probability 0"),
    "kv-append-values-first": ("0 of 64 completions are the same as the stock engine's",),
    "decode-step-counts-the-new-token-twice": ("completions are the same as the stock engine's",),
    "slot-for-alone-ignores-the-block-table": (
        "0 of 64 completions are the same as the stock engine's",
    ),
    "hash-alone-ignores-the-parent": (
        "Your engine stopped",
        "block_hashes of r0's 64 tokens differs from hash_block_tokens chained block by block: "
        "first at block 1",
    ),
    "remove-keeps-the-slot": (
        "the host tier forgetting half its entries one at a time, then filling up differs, after "
        "the run:",
        "the stock engine: then 24 new entries: 12 took a free slot",
        "yours: then 24 new entries: 0 took a free slot",
    ),
    "remove-pops-the-lru": (
        "Your engine stopped",
        "your insert(000000000000) gave slot 18, which holds 9c9207267ea3, and evicted nothing",
    ),
}
# The engine's proposers are certain (q is 1 at the proposal), where u * q(x) < p(x) and
# u < p(x) are the same test: no run of this engine can show that wrong rule, only the check.
# A hash that is not one-to-one shows only where two prompts' blocks collide, which no workload's
# do; a hash salted per process is the same in every call of the one process a run serves in.
NOT_SHOWN_BY_THE_ENGINE = {"accepts-without-q", "digits-joined", "salted-hash"}


def _command(home: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`nanovllm lesson ARGV` in a process of its own, with `home` as NANOVLLM_HOME."""
    env = {**os.environ, "NANOVLLM_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "nanovllm", "lesson", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_every_wrong_solution_is_either_shown_by_the_engine_or_named_as_not():
    assert {name for _, name, _ in WRONG_FOR_RUN} == set(
        SHOWN_BY_THE_ENGINE
    ) | NOT_SHOWN_BY_THE_ENGINE


SHOWN = [case for case in WRONG_FOR_RUN if case[1] in SHOWN_BY_THE_ENGINE]


def _wrong_solution_run(number: int, changes, home: Path) -> subprocess.CompletedProcess:
    """`--run --unchecked` of lesson `number` against its worked solution with `changes` made."""
    _wrong(number, home / "lessons", *changes)
    return _command(home, str(number), "--run", "--unchecked")


def _reference_run(lesson, home: Path) -> subprocess.CompletedProcess:
    return _command(home, str(lesson.number), "--run", "--against", "reference")


def _triton_missing(lesson) -> bool:
    return lesson.name == "05_triton_kernel" and importlib.util.find_spec("triton") is None


@pytest.fixture(scope="module")
def commands(request, tmp_path_factory) -> Iterator[CommandsAhead]:
    """The commands of this file's selected command tests, run ahead two at a time
    (`commands_ahead.py`), each with a NANOVLLM_HOME of its own."""
    ahead = CommandsAhead()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.originalname == "test_the_engine_itself_shows_each_wrong_solution":
            home = tmp_path_factory.mktemp("wrong")
            ahead.add(item.nodeid, functools.partial(
                _wrong_solution_run, params["number"], params["changes"], home
            ))  # fmt: skip
        elif item.originalname == "test_the_reference_passes_run_through_the_command":
            if not _triton_missing(params["lesson"]):
                home = tmp_path_factory.mktemp("reference")
                ahead.add(item.nodeid, functools.partial(_reference_run, params["lesson"], home))
    yield ahead
    ahead.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "number,name,changes", SHOWN, ids=[f"{n:02d}-{name}" for n, name, _ in SHOWN]
)
def test_the_engine_itself_shows_each_wrong_solution(number, name, changes, commands, request):
    """Through the command, with the check skipped: the run's workload makes the engine show
    the fault (a queue whose head does not fit, proposals to verify, prompts that end at a
    block's end, a double free once idle, seeded sampled requests), and the report names the
    first step where the learner's engine decided otherwise."""
    done = commands.result(request.node.nodeid)
    out = _flat(done.stdout)
    assert done.returncode == 1, out + done.stderr
    assert "Your engine produced the same" not in out
    assert "Checking lesson" not in out, "the check was skipped"
    for words in SHOWN_BY_THE_ENGINE[name]:
        assert words in out, out


@pytest.mark.slow
@pytest.mark.parametrize(
    "lesson",
    [lesson for lesson in all_lessons() if your_engine.has_run(lesson)],
    ids=lambda lesson: lesson.name,
)
def test_the_reference_passes_run_through_the_command(lesson, commands, request):
    """`nanovllm lesson N --run --against reference`: checked, then the same completions and the
    same decisions as the stock engine, in every lesson that has a `--run`."""
    if _triton_missing(lesson):
        pytest.skip("triton is not installed")
    done = commands.result(request.node.nodeid)
    out = _flat(done.stdout)
    assert done.returncode == 0, out + done.stderr[-2000:]
    assert "Your engine produced the same" in out, out


def _interface(lesson) -> list[str]:
    """The exercise's public functions and classes, and each class's public methods, as
    `name` and `Class.method`, read from its exercise.py."""
    import ast

    names = []
    for node in ast.parse(lesson.file("exercise.py").read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            names.append(node.name)
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            names += [
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
            ]
    return names


def _recording(impl, names: list[str], calls: set[str]):
    """`impl` with each of `names` wrapped to add its name to `calls` when called (a class:
    when built, and its listed methods when called)."""

    def wrap(function, name):
        @functools.wraps(function)
        def recorded(*args, **kwargs):
            calls.add(name)
            return function(*args, **kwargs)

        return recorded

    replacements = {}
    for name in (n for n in names if "." not in n):
        value = getattr(impl, name)
        if isinstance(value, type):
            methods = {m.split(".")[1] for m in names if m.startswith(f"{name}.")}
            attrs = {m: wrap(getattr(value, m), f"{name}.{m}") for m in methods}
            attrs["__init__"] = wrap(value.__init__, name)

            class Recorded(value):  # the lesson's class, its listed methods recorded
                pass

            for method, fn in attrs.items():
                setattr(Recorded, method, fn)
            Recorded.__name__ = Recorded.__qualname__ = name
            replacements[name] = Recorded
        else:
            replacements[name] = wrap(value, name)
    return testing.variant(impl, **replacements)


def _recording_in_every_rank(lesson, names: list[str], folder: Path, monkeypatch):
    """Lesson 14's reference as a file (every rank's process loads it), each function adding
    its name to `folder/calls`, in whichever process calls it; the check `--run` makes on the
    model before building the engine is skipped, so only the engine's calls are recorded."""
    from nanovllm.lessons import plug_tensor_parallel

    monkeypatch.setattr(plug_tensor_parallel, "check_on_the_model", lambda *args: None)
    lines = [
        "import importlib.util",
        f"_spec = importlib.util.spec_from_file_location('_ref', {str(lesson.file('reference.py'))!r})",
        "_ref = importlib.util.module_from_spec(_spec)",
        "_spec.loader.exec_module(_ref)",
        f"__all__ = {names!r}",
    ]
    for name in names:
        lines += [
            f"def {name}(*args, **kwargs):",
            f"    with open({str(folder / 'calls')!r}, 'a') as f:",
            f"        f.write({name!r} + '\\n')",
            f"    return _ref.{name}(*args, **kwargs)",
        ]
    path = folder / "recording.py"
    path.write_text("\n".join(lines) + "\n")
    return harness.implementation(lesson, path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "lesson",
    [lesson for lesson in all_lessons() if your_engine.has_run(lesson)],
    ids=lambda lesson: lesson.name,
)
def test_run_calls_every_function_of_the_exercise(lesson, tmp_path, monkeypatch):
    """`--run` exercises the whole interface: every public function, class and method of the
    exercise is called while the engine serves the lesson's workload (with the reference), so
    no wrong one can go unseen by the run (issue 40: lesson 15's `remove`, lesson 1's `KVCache`
    and `decode_step`, lesson 2's `slot_for` and lesson 8's `hash_block_tokens` once were)."""
    if lesson.name == "05_triton_kernel":
        pytest.importorskip("triton")
    names = _interface(lesson)
    calls: set[str] = set()
    if lesson.name == "14_tensor_parallelism":
        impl = _recording_in_every_rank(lesson, names, tmp_path, monkeypatch)
    else:
        impl = _recording(harness.implementation(lesson, "reference"), names, calls)
    report = your_engine.run_lesson(lesson, impl)
    assert report.error is None and report.passed, report.error or report.differences
    if lesson.name == "14_tensor_parallelism":
        calls = set((tmp_path / "calls").read_text().split())
    assert sorted(set(names) - calls) == [], f"never called by --run: {sorted(set(names) - calls)}"


@functools.cache
def _verification_rules() -> tuple:
    """Lesson 13's worked solution, and the same with the acceptance test ignoring q."""
    folder = Path(tempfile.mkdtemp())
    lesson = get_lesson(13)
    right = harness.implementation(lesson, solve(lesson, folder / "right"))
    changes = dict((name, c) for _, name, c in WRONG_FOR_RUN)["accepts-without-q"]
    wrong = harness.implementation(lesson, _wrong(13, folder / "wrong", *changes))
    return right, wrong


@settings(max_examples=examples(60), deadline=None)
@given(
    vocab=st.integers(2, 6),
    s=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    spelled_out=st.booleans(),
    data=st.data(),
)
def test_ignoring_q_changes_nothing_for_a_certain_proposer(vocab, s, seed, spelled_out, data):
    """Why `--run` cannot show the acceptance test without q: for the engine's proposers (q is 1
    at each proposal, given as None or spelled out, as `--run` does) it emits exactly what the
    right rule emits, draw for draw. Oracle: the worked solution, on the same generator seed."""
    right, wrong = _verification_rules()
    weights = data.draw(
        st.lists(
            st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0]), min_size=vocab, max_size=vocab).filter(
                any
            ),
            min_size=s + 1,
            max_size=s + 1,
        )
    )
    probs = torch.tensor(weights)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    proposals = data.draw(st.lists(st.integers(0, vocab - 1), min_size=s, max_size=s))
    q = torch.nn.functional.one_hot(torch.tensor(proposals, dtype=torch.int64), vocab).float()
    q = q if spelled_out else None
    emitted = [
        rules.verify_random(probs, proposals, torch.Generator().manual_seed(seed), q)
        for rules in (right, wrong)
    ]
    assert emitted[0] == emitted[1]


def test_a_run_that_never_ends_is_stopped_at_its_deadline(monkeypatch, home):
    """A schedule_step that loops for ever in the engine (it passed no check: called directly)
    is stopped at the run's deadline, and the report says so."""
    lesson = get_lesson(6)

    def forever(running, waiting, max_num_seqs, token_budget):
        while True:
            pass

    monkeypatch.setattr(your_engine, "RUN_DEADLINE_S", 2.0)
    impl = testing.variant(harness.implementation(lesson, "reference"), schedule_step=forever)
    start = time.monotonic()
    report = your_engine.run_lesson(lesson, impl, workload="short")
    assert time.monotonic() - start < 60
    assert report.error is not None and "ran past its deadline of 2 s" in report.error


def test_a_huge_allocation_in_the_engine_gets_a_plain_message(home):
    lesson = get_lesson(2)

    def blocks_needed(num_tokens, block_size):
        return len(bytearray(1 << 60))

    impl = testing.variant(harness.implementation(lesson, "reference"), blocks_needed=blocks_needed)
    report = your_engine.run_lesson(lesson, impl, workload="short")
    assert report.error is not None
    assert "your code asked for more memory than this machine has" in report.error, report.error


# --- the comparison, on made-up runs --------------------------------------------------------------


def _events_of(steps: list[dict[str, int]]) -> list:
    from nanovllm.events import BlockAllocated, StepSummary

    events = []
    for number, scheduled in enumerate(steps, start=1):
        for rid, n in scheduled.items():
            events.extend(BlockAllocated(rid, 100 * number + i, i) for i in range(n))
        events.append(StepSummary(number, dict(scheduled), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0))
    return events


schedules = st.lists(
    st.dictionaries(st.sampled_from(["r0", "r1", "r2"]), st.integers(1, 3), max_size=3),
    min_size=1,
    max_size=6,
)


@given(stock=schedules, data=st.data())
def test_the_first_step_that_differs_is_named(stock, data):
    """Oracle: the made-up runs themselves. Another run equal to the stock one up to a step and
    different there is reported at that step, for the scheduling decisions and for the blocks
    (one block per token here); an identical run is reported as no difference."""
    assert compare.first_difference("schedule", _events_of(stock), _events_of(stock)) is None
    at = data.draw(st.integers(0, len(stock) - 1))
    changed = dict(stock[at])
    rid = data.draw(st.sampled_from(["r0", "r1", "r2"]))
    changed[rid] = changed.get(rid, 0) + 1
    yours = [*stock[:at], changed, *stock[at + 1 :]]
    for aspect in ("schedule", "blocks"):
        found = compare.first_difference(aspect, _events_of(stock), _events_of(yours))
        assert found is not None and found.startswith(f"at step {at + 1}:"), found
        assert rid in found


# --- reports that point at the right code -------------------------------------------------------


def test_an_acceptance_that_ignores_q_is_named_as_the_fault(home, capsys):
    """Lesson 13: a rule that accepts with probability p, not min(1, p/q). It rejects proposals
    that must always be accepted (p >= q there): the report says the acceptance test is wrong,
    not the residual (which is p - q > 0 there)."""
    _wrong(13, home / "lessons", ("if u * q_x < float(p[x]):", "if u < float(p[x]):"))
    assert _cli("13", "--check") == 1
    out = _flat(capsys.readouterr().out)
    assert "The fault is in your acceptance test" in out, out
    assert "which is 0 there" not in out


def test_a_scheduler_failure_shows_the_state_by_name_and_what_you_returned(home, capsys):
    """Lesson 6: the state's requests are shown with their ids and named numbers, and what
    schedule_step returned (and left in the queues) is in the short report."""
    _wrong(6, home / "lessons", *SHORTER_AHEAD_OF_THE_HEAD)
    assert _cli("6", "--check") == 1
    out = _flat(capsys.readouterr().out)
    assert "state.waiting[0] = w0: prompt" in out, out
    assert "schedule_step returned = {" in out and "then waiting = [" in out, out


# --- smaller ones -------------------------------------------------------------------------------


def test_a_screenshot_without_the_visualizer_is_refused(home, tmp_path, capsys):
    assert _cli("7", "--screenshot", str(tmp_path / "x.svg")) == 2
    assert "--screenshot goes with --viz" in capsys.readouterr().out


def test_against_a_missing_file_says_so_once(home, tmp_path, capsys):
    for act in ("--check", "--run"):
        assert _cli("2", act, "--against", str(tmp_path / "missing.py")) == 2
        raw = capsys.readouterr().out
        out = _flat(raw)
        # (rich may wrap the path anywhere, even inside a name: compare it with no whitespace)
        assert "There is no file" in out and str(tmp_path / "missing.py") in "".join(raw.split())
        assert "Not yet" not in out and "FileNotFoundError" not in out


def test_no_lesson_text_sends_the_learner_to_a_file_their_folder_lacks():
    """The learner's folder holds only their exercise: a lesson's `run.py` is named by its
    place in the clone, and that file is there."""
    for lesson in all_lessons():
        text = " ".join(lesson.readme.read_text().split())
        assert "in this lesson's folder" not in text, lesson.name
        if "run.py`" in text:
            assert f"`lessons/{lesson.name}/run.py` in the nanovllm clone" in text, lesson.name
            assert lesson.file("run.py").is_file()
