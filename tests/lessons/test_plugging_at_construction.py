"""Lessons plug a learner's part in when the engine is built (`EngineParts`), never into a built
engine: a check on the source of `lessons/` (issue 43).

The plumbing of `lessons/` (its package modules and every lesson's `run.py` and `demo.py`; not
the learner's exercise, reference and mutants, whose code is what the lesson teaches) may not:

- assign to an attribute of an engine object (`engine.scheduler.schedule = ...`,
  `runner.prepare_inputs = ...`, `kv.allocate_slots = ...`, `meta.slot_mapping = ...`), nor
  `setattr` one. An engine object is one reached from a name or attribute the engine's parts
  go by (`ENGINE_NAMES`: `engine`, `runner`, `kv`, `meta`, ...), or from a local bound to one
  (`s = self.scheduler`, `for block in kv.blocks`). A part's own `self.x = ...` is its own;
- assign to another module's globals: to an attribute of an imported name
  (`module.verify_greedy = ...`, `OffloadingConnector.tier_class = ...`), or `setattr` on one.

Oracle: the rules above, written out; `test_the_check_finds_the_old_assignments` shows it
catches each kind the old `plug.py` made, and lets through what the new one does instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
ENGINE_NAMES = {
    "engine", "llm_engine", "setup", "runner", "executor", "model", "layers", "self_attn",
    "attn", "scheduler", "kv_cache_manager", "kv", "free_block_queue", "blocks", "block",
    "sampler", "output_processor", "input_processor", "detokenizer", "kv_connector",
    "connector", "tier", "meta",
}  # fmt: skip


def plumbing() -> list[Path]:
    files = sorted(LESSONS.glob("*.py")) + sorted(LESSONS.glob("*/run.py"))
    return files + sorted(LESSONS.glob("*/demo.py"))


def _chain(node: ast.expr) -> tuple[str | None, list[str]]:
    """The name an expression's attribute chain starts at, and the attributes along it
    (`a`, [b, c] for `a.b[0].c`, or for `a.b(x).c`)."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        if isinstance(node, ast.Attribute):
            attrs.append(node.attr)
        node = node.func if isinstance(node, ast.Call) else node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs[::-1]


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign | ast.Delete):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For):
        found = [node.target]
    else:
        return []
    flat = []
    while found:
        target = found.pop()
        if isinstance(target, ast.Tuple | ast.List):
            found.extend(target.elts)
        elif isinstance(target, ast.Starred):
            found.append(target.value)
        else:
            flat.append(target)
    return flat


class _Check(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()
        self.found: list[str] = []
        self.imported: set[str] = set()

    def report(self, node: ast.AST, why: str) -> None:
        self.found.append(f"line {node.lineno}: {self.lines[node.lineno - 1].strip()} ({why})")

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.imported |= {(a.asname or a.name).split(".")[0] for a in node.names}

    visit_ImportFrom = visit_Import

    def visit_Module(self, node: ast.Module) -> None:
        for item in ast.walk(node):  # imports first, wherever they are (some are in functions)
            if isinstance(item, ast.Import | ast.ImportFrom):
                self.visit_Import(item)
        self.check(node, params=set())
        for item in ast.walk(node):
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                args = item.args
                params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
                self.check(item, params)

    def engine_object(self, node: ast.expr, tracked: set[str]) -> bool:
        root, attrs = _chain(node)
        return root in tracked or any(a in ENGINE_NAMES for a in attrs)

    def check(self, scope: ast.AST, params: set[str]) -> None:
        """The assignments directly in `scope` (a module or a function)."""
        tracked = {p for p in params if p in ENGINE_NAMES}
        statements = list(_own_nodes(scope))
        fresh = {  # names bound to an object made here, by a call (`model = ToyModel()`)
            target.id
            for node in statements
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for target in node.targets
            if isinstance(target, ast.Name) and not self.engine_object(node.value.func, tracked)
        }
        for node in statements:  # locals bound to engine objects (twice: chains of them)
            for target in _targets(node) * 2:
                value = node.iter if isinstance(node, ast.For) else getattr(node, "value", None)
                if not isinstance(target, ast.Name) or value is None or target.id in fresh:
                    continue
                if target.id in ENGINE_NAMES or self.engine_object(value, tracked):
                    tracked.add(target.id)
        for node in statements:
            if isinstance(node, ast.Call):
                _, attrs = _chain(node.func)
                name = node.func.id if isinstance(node.func, ast.Name) else attrs[-1:]
                if name in ("setattr", ["setattr"], ["__setattr__"]) and node.args:
                    root, _ = _chain(node.args[0])
                    if root in self.imported or self.engine_object(node.args[0], tracked):
                        self.report(node, "setattr on an engine object or another module")
            if isinstance(node, ast.For):
                continue
            for target in _targets(node):
                if not isinstance(target, ast.Attribute):
                    continue
                root, attrs = _chain(target)
                if root in self.imported:
                    self.report(node, f"assigns to a global of {root!r}, another module")
                elif root == "self" and len(attrs) == 1:
                    continue  # a part's own attribute
                elif root in tracked or any(a in ENGINE_NAMES for a in attrs[:-1]):
                    if root in fresh and not any(a in ENGINE_NAMES for a in attrs[:-1]):
                        continue
                    self.report(node, f"assigns to an attribute of {root!r}, an engine object")


def _own_nodes(scope: ast.AST):
    """The nodes of `scope`, not descending into the functions and classes defined in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            if isinstance(node, ast.ClassDef):
                todo.extend(n for n in node.body if not isinstance(n, ast.FunctionDef))
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def violations(source: str) -> list[str]:
    check = _Check(source)
    check.visit(ast.parse(source))
    return sorted(set(check.found))


@pytest.mark.parametrize("path", plumbing(), ids=lambda p: str(p.relative_to(LESSONS)))
def test_lessons_assign_nothing_into_a_built_engine_or_another_module(path: Path) -> None:
    assert violations(path.read_text()) == []


OLD_PLUG = """
from nanovllm.executor import sampler as module
from nanovllm.kv_transfer.offloading import OffloadingConnector

def swap_verification(engine, impl):
    engine.runner.sampler = YourVerification(engine.runner.sampler)

def swap_slot_mapping(engine, impl):
    kv, runner = engine.kv_cache_manager, engine.runner
    kv.allocate_slots = allocate_slots
    runner.prepare_inputs = prepare_inputs

def prepare_inputs(out):
    input_ids, positions, meta, rows = stock(out)
    meta.slot_mapping = slots

def swap_attention(engine, make):
    for module, name, backend in attention_backends(engine):
        setattr(module, name, make())

def swap_free_block_queue(engine, queue_class):
    for block in engine.kv_cache_manager.blocks:
        block.prev_free = block.next_free = None

class YourVerification:
    def __call__(self, logits):
        module.verify_greedy, module.verify_random = greedy, random

def your_host_tier(tier_class):
    OffloadingConnector.tier_class = tier_class

class YourScheduleStep:
    def __call__(self):
        s = self.scheduler
        s.running = []
"""


def test_the_check_finds_the_old_assignments() -> None:
    """Each kind of assignment the old `plug.py` made into a built engine is found (its lines,
    abridged, above), and what the new one does instead is not."""
    found = violations(OLD_PLUG)
    for line in (
        "engine.runner.sampler = ",
        "kv.allocate_slots = ",
        "runner.prepare_inputs = ",
        "meta.slot_mapping = ",
        "setattr(module, name, make())",
        "block.prev_free = ",
        "module.verify_greedy, module.verify_random = ",
        "OffloadingConnector.tier_class = ",
        "s.running = ",
    ):
        assert any(line in f for f in found), (line, found)
    new = """
import functools

class YourScheduler(Scheduler):
    def schedule(self):
        self.running = []
        out = SchedulerOutput()
        out.schedule_time = 0.0
        for request in self.running:
            request.status = RUNNING

def your_scheduler(call):
    return functools.partial(YourScheduler, schedule_step=call)
"""
    assert violations(new) == []
