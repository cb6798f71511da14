"""Generated mutants: the measure of a lesson's check.

The planted bugs of each lesson's `mutants.py` are the mistakes someone thought of. Generated
mutants are the ones nobody listed: every small change a mutation-testing tool makes to the code a
lesson's exercise stands for (a `<` for a `<=`, a `+ 1` for a `- 1`, a `None` for a value, an
argument dropped), each a wrong solution a learner could write. A lesson's properties are as good
as the share of them they reject.

The mutants come from mutmut (3.x)'s generator: its libcst operators, applied one at a time to
the functions each lesson names in `TARGETS` (the reference's own functions, and the engine
functions the reference delegates to). mutmut rather than cosmic-ray: its operators are plain
functions over libcst nodes that need no configuration, session database or worker processes,
so one mutation is one call here; and it is a single pure-Python dependency (libcst), where
cosmic-ray brings its own runner, database and config files that this course does not use.
mutmut's own runner (which rewrites a source tree with trampolines and runs pytest) is not used:
our harness runs the lesson's properties in-process, hundreds of examples a second.

A mutant is put in place by swapping the mutated function's code object into the engine's own
function (`applied`): every module that imported it sees the mutant, and nothing is re-imported.
Each lesson then runs its properties against its reference, as `--mutants` does for planted
bugs (`harness.try_mutant`'s two passes: a few examples each, then the full count). A mutant is
*killed* when a property fails (an example past its deadline counts: a mutant that loops for
ever is caught). One that survives is either killed by a stronger property, or listed in the
lesson's `equivalent_mutants.txt` with a one-line reason: `<id>  <reason>`, where the id is a
hash of the function, the changed line and its mutation (stable across unrelated edits).

`nanovllm lesson --mutate [N]` runs each lesson in a child process (`python -m
nanovllm.lessons.mutation N`, niced, one JSON line per mutant): a mutant that crashes or hangs
the process is counted as killed and the run goes on from the next mutant.

Killed once is not killed on every seed: a learner's `--check` draws new examples each time.
`nanovllm lesson --mutate --fresh K [N]` (`python -m nanovllm.lessons.mutation --fresh K N`)
tries every mutant not listed as equivalent K times, each time with fresh random examples, and
shows each one that survived any try, with how many (`fresh_sweep`).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import os
import random
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from nanovllm.lessons.catalog import Lesson, all_lessons, get_lesson, lesson_module


@dataclass(frozen=True)
class Target:
    """Code a lesson's exercise stands for: `module` (a dotted name, or "reference" for the
    lesson's reference.py) and the qualified names of its functions to mutate (a class name
    takes all its methods; empty: every function of the module)."""

    module: str
    functions: tuple[str, ...] = ()


REF = Target("reference")

# What each lesson's mutants are made from. Lesson 12's are its systems under test (the
# allocator and slot_for); its properties are the learner's, scored against these mutants.
TARGETS: dict[str, tuple[Target, ...]] = {
    "01_kv_cache": (
        REF,
        Target(
            "nanovllm.models.attention",
            ("store_kv", "gather_context", "TorchAttention"),
        ),
    ),
    "02_paged_blocks": (
        REF,
        Target(
            "nanovllm.core.kv_cache_manager",
            ("KVCacheManager.get_num_blocks_to_allocate", "KVCacheManager.allocate_slots"),
        ),
        Target("nanovllm.executor.step_inputs", ("step_metadata",)),
    ),
    "03_free_block_queue": (
        Target(
            "nanovllm.core.free_block_queue",
            tuple(
                f"FreeBlockQueue.{name}"
                for name in ("__init__", "popleft", "remove", "append", "get_all_free_blocks")
            ),
        ),
    ),
    "04_paged_attention": (
        REF,
        Target("nanovllm.models.attention", ("gather_context", "TorchAttention")),
    ),
    "05_triton_kernel": (REF,),
    "06_continuous_batching": (
        Target(
            "nanovllm.core.scheduler",
            ("Scheduler.schedule", "Scheduler.add_to_step", "Scheduler.num_tokens"),
        ),
    ),
    "07_preemption": (
        Target(
            "nanovllm.core.scheduler",
            (
                "Scheduler.schedule",
                "Scheduler.add_to_step",
                "Scheduler.num_tokens",
                "Scheduler.preempt",
            ),
        ),
    ),
    "08_prefix_caching": (
        REF,
        Target("nanovllm.core.block_hash", ("hash_block_tokens", "extend_block_hashes")),
        Target("nanovllm.core.kv_cache_manager", ("KVCacheManager.get_computed_blocks",)),
        Target(
            "nanovllm.core.single_type_kv_cache_manager",
            ("FullAttentionManager.find_longest_cache_hit",),
        ),
    ),
    "09_chunked_prefill": (
        REF,
        Target(
            "nanovllm.core.scheduler",
            ("Scheduler.schedule", "Scheduler.add_to_step", "Scheduler.num_tokens"),
        ),
        Target("nanovllm.executor.step_inputs", ("step_inputs", "step_metadata")),
    ),
    "10_sampling_streaming": (
        REF,
        Target("nanovllm.executor.sampler", ("apply_filters",)),
        Target("nanovllm.engine.detokenizer", ("IncrementalDetokenizer",)),
    ),
    "11_serving_benchmarking": (
        REF,
        Target("nanovllm.bench.stats", ("percentile",)),
        Target("nanovllm.bench.records", ("RequestRecord",)),
        Target("nanovllm.serve.sse", ("sse_data",)),
    ),
    "12_properties": (
        Target(
            "nanovllm.core.kv_cache_manager",
            (
                "KVCacheManager.get_num_blocks_to_allocate",
                "KVCacheManager.allocate_slots",
                "KVCacheManager.free",
                "KVCacheManager.get_block_table",
            ),
        ),
        Target("nanovllm.core.block_pool", ("BlockPool.get_new_block", "BlockPool.free_block")),
        Target("nanovllm.executor.step_inputs", ("step_metadata",)),
    ),
    "13_speculative_decoding": (
        Target("nanovllm.executor.rejection_sampler", ("draw", "verify_greedy", "verify_random")),
    ),
    "14_tensor_parallelism": (
        REF,
        Target(
            "nanovllm.models.linear",
            (
                "divide",
                "LinearBase.__init__",
                "LinearBase.create_parameters",
                "ColumnParallelLinear.__init__",
                "ColumnParallelLinear.weight_loader",
                "QKVParallelLinear.__init__",
                "QKVParallelLinear.weight_loader",
                "RowParallelLinear.__init__",
                "RowParallelLinear.weight_loader",
            ),
        ),
    ),
    "15_where_the_kv_lives": (
        Target(
            "nanovllm.kv_transfer.host_tier",
            tuple(
                f"HostBlockTier.{name}"
                for name in ("lookup", "touch", "num_matched", "insert", "remove", "clear")
            ),
        ),
    ),
    "16_sliding_window": (
        Target("nanovllm.core.sliding_window_manager", ("SlidingWindowManager",)),
    ),
    "17_mixture_of_experts": (
        Target("nanovllm.models.moe", ("select_experts", "sort_by_expert", "fused_experts")),
    ),
    "18_memory_bound_decode": (
        REF,
        Target("nanovllm.models.gguf_quants", ("dequantize", "_half")),
        Target("nanovllm.models.quantized_linear", ("dequantize_linear",)),
    ),
}


# Which of a lesson's checks judge a mutant (default: all). Lesson 12's other checks run the
# learner's properties against planted bugs and against these very mutants; the one that says
# whether the reference properties notice a mutated engine is its pass on the engine.
CHECKS: dict[str, tuple[str, ...]] = {
    "12_properties": ("test_your_properties_pass_on_the_engine",),
}


@dataclass(frozen=True)
class GeneratedMutant:
    """One generated mutant: `function` of `module` (a Target's) with one change."""

    id: str  # stable: a hash of module, function, the changed lines and their mutation
    module: str
    function: str  # the qualified name of the mutated top-level function or method
    line: int  # where the change is in the file now (shown, not part of the id)
    original: str  # the changed line(s) as they are
    mutated: str  # ... and as the mutant has them
    source: str  # the mutated function's text (dedented)
    first_line: int  # the function's first line in its file
    owner: str | None  # the class of a method

    def diff(self) -> str:
        """The change as code: the original line beside (above) the mutated one."""
        minus = "\n".join(f"- {line}" for line in self.original.splitlines())
        plus = "\n".join(f"+ {line}" for line in self.mutated.splitlines()) or "+ (removed)"
        return f"{self.module}:{self.line} in {self.function}\n{minus}\n{plus}"


# --- generating ------------------------------------------------------------------------------


def module_file(lesson: Lesson, module: str) -> Path:
    if module == "reference":
        return lesson.file("reference.py")
    return Path(importlib.import_module(module).__file__ or "")


def loaded_module(lesson: Lesson, module: str) -> types.ModuleType:
    if module == "reference":
        return lesson_module(lesson, "reference")
    return importlib.import_module(module)


def _visitor_class():
    """mutmut's mutation visitor, letting it into property getters too (mutmut skips every
    decorated function, since its trampolines cannot wrap them; swapping code objects can)."""
    import libcst as cst
    from mutmut.mutation.file_mutation import MutationVisitor

    class Visitor(MutationVisitor):
        def _skip_node_and_children(self, node: cst.CSTNode) -> bool:
            if isinstance(node, cst.FunctionDef) and [
                getattr(d.decorator, "value", None) for d in node.decorators
            ] == ["property"]:
                return False
            return super()._skip_node_and_children(node)

    return Visitor


def _functions(module: Any) -> dict[int, tuple[str, str | None]]:
    """id of each top-level function and method node -> (qualified name, its class or None)."""
    import libcst as cst

    found: dict[int, tuple[str, str | None]] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            found[id(stmt)] = (stmt.name.value, None)
        elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
            for method in stmt.body.body:
                if isinstance(method, cst.FunctionDef):
                    found[id(method)] = (f"{stmt.name.value}.{method.name.value}", stmt.name.value)
    return found


def _wanted(qualname: str, functions: tuple[str, ...]) -> bool:
    return not functions or any(qualname == f or qualname.startswith(f + ".") for f in functions)


def generate_target(lesson: Lesson, target: Target) -> list[GeneratedMutant]:
    """Every mutant mutmut's operators make of `target`'s functions, in source order."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import deep_replace
    from mutmut.mutation.mutators import mutation_operators
    from mutmut.mutation.pragma_handling import IgnoredCode, PragmaVisitor

    path = module_file(lesson, target.module)
    wrapper = MetadataWrapper(cst.parse_module(path.read_text(encoding="utf-8")))
    pragmas = PragmaVisitor(str(path))
    wrapper.visit(pragmas)
    ignored = IgnoredCode(pragmas.no_mutate_lines, pragmas.ignore_node_lines, set())
    visitor = _visitor_class()(mutation_operators, ignored)
    module = wrapper.visit(visitor)
    positions = wrapper.resolve(PositionProvider)
    functions = _functions(module)
    texts: dict[int, str] = {}
    out: list[GeneratedMutant] = []
    seen: dict[str, int] = {}
    for mutation in visitor.mutations:
        function = mutation.contained_by_top_level_function
        if id(function) not in functions:
            continue
        qualname, owner = functions[id(function)]
        if not _wanted(qualname, target.functions):
            continue
        # The function alone, as it is and as mutated (rendering the whole module per mutant
        # would cost seconds in a large module), without the blank lines before it.
        function = function.with_changes(leading_lines=())
        if id(mutation.contained_by_top_level_function) not in texts:
            texts[id(mutation.contained_by_top_level_function)] = module.code_for_node(function)
        old_text = texts[id(mutation.contained_by_top_level_function)]
        new_function = deep_replace(
            mutation.contained_by_top_level_function, mutation.original_node, mutation.mutated_node
        )
        new_text = module.code_for_node(new_function.with_changes(leading_lines=()))  # type: ignore[union-attr]
        old_lines, new_lines = old_text.splitlines(), new_text.splitlines()
        matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
        changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
        if not changes:
            continue
        first, last = changes[0], changes[-1]
        original = "\n".join(line.strip() for line in old_lines[first[1] : last[2]])
        changed = "\n".join(line.strip() for line in new_lines[first[3] : last[4]])
        key = f"{target.module}:{qualname}:{original}->{changed}"
        seen[key] = seen.get(key, 0) + 1
        digest = hashlib.sha1(f"{key}#{seen[key]}".encode()).hexdigest()[:10]
        start = positions[mutation.contained_by_top_level_function].start.line
        out.append(
            GeneratedMutant(
                digest,
                target.module,
                qualname,
                start + first[1],
                original,
                changed,
                new_text,
                start,
                owner,
            )
        )
    return out


@cache
def generate(lesson_name: str) -> tuple[GeneratedMutant, ...]:
    """Every generated mutant of a lesson's targets."""
    lesson = get_lesson(lesson_name)
    return tuple(m for t in TARGETS.get(lesson.name, ()) for m in generate_target(lesson, t))


def equivalents(lesson: Lesson) -> dict[str, str]:
    """The lesson's mutants listed as equivalent (`equivalent_mutants.txt`): id -> reason."""
    path = lesson.file("equivalent_mutants.txt")
    if not path.is_file():
        return {}
    listed = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            mutant_id, _, reason = line.partition(" ")
            listed[mutant_id] = reason.strip()
    return listed


# --- putting a mutant in place ------------------------------------------------------------------


def _function(module: Any, qualname: str) -> types.FunctionType:
    owner: Any = module
    *outer, name = qualname.split(".")
    for part in outer:
        owner = getattr(owner, part)
    obj = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    obj = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    if not isinstance(obj, types.FunctionType):
        raise TypeError(f"{qualname} is not a plain function")
    return obj


def mutated_function(lesson: Lesson, mutant: GeneratedMutant) -> types.FunctionType:
    """The mutated function (made once per process: see `_mutated_function`)."""
    return _mutated_function(lesson.name, mutant)


@cache
def _mutated_function(lesson_name: str, mutant: GeneratedMutant) -> types.FunctionType:
    """The mutated function, defined where it stands in its file: among its module's names (for
    the default values of its parameters), a method inside a class of its class's name (so that
    `super()` finds its `__class__`), on the lines it has there (for tracebacks)."""
    import textwrap

    lesson = get_lesson(lesson_name)
    text = mutant.source
    if mutant.owner is not None:
        text = f"class {mutant.owner}:\n" + textwrap.indent(text, "    ")
    padding = "\n" * (mutant.first_line - 1 - (mutant.owner is not None))
    module = loaded_module(lesson, mutant.module)
    compiled = compile(padding + text, module.__file__ or "<mutant>", "exec", dont_inherit=True)
    namespace = dict(vars(module))  # a copy: the module's own names stay as they are
    exec(compiled, namespace)
    scope = types.SimpleNamespace(**namespace)
    return _function(scope, mutant.function)  # type: ignore[arg-type]


@contextmanager
def applied(lesson: Lesson, mutant: GeneratedMutant) -> Iterator[None]:
    """`mutant` in place of the engine's (or the reference's) function for the `with` block:
    its code and its parameters' default values."""
    function = _function(loaded_module(lesson, mutant.module), mutant.function)
    new = mutated_function(lesson, mutant)
    saved = function.__code__, function.__defaults__, function.__kwdefaults__
    function.__code__ = new.__code__
    function.__defaults__, function.__kwdefaults__ = new.__defaults__, new.__kwdefaults__
    try:
        yield
    finally:
        function.__code__, function.__defaults__, function.__kwdefaults__ = saved


# --- running -------------------------------------------------------------------------------------

QUICK_EXAMPLES = 8  # the first, short pass (as harness.try_mutant)
MUTANT_DEADLINE_S = 10.0  # one example of one mutant: a mutant that loops is stopped here


@dataclass
class Verdict:
    id: str
    killed_by: str | None  # the first property that failed; None: survived
    error: str | None
    seconds: float
    survived: int = 0  # tries in which no property failed (`try_repeatedly`)


def try_generated(
    lesson: Lesson, mutant: GeneratedMutant, *, fresh: bool = False, quick: int | None = None
) -> Verdict:
    """Run the lesson's properties against its reference with `mutant` in place: a few examples
    each, then each property's own count; `quick`: only that many examples each."""
    from nanovllm.lessons import harness

    start = time.perf_counter()
    impl = lesson_module(lesson, "reference")
    clear_caches(lesson)
    try:
        with applied(lesson, mutant):
            for budget in (QUICK_EXAMPLES, None) if quick is None else (quick,):
                for name, prop in _checks(lesson):
                    result = harness.run_property(
                        name, prop, impl, budget, fresh=fresh, deadline_s=MUTANT_DEADLINE_S
                    )
                    if not result.passed:
                        return Verdict(
                            mutant.id, result.name, result.error, time.perf_counter() - start
                        )
    except (LookupError, TypeError, ValueError, SyntaxError) as exc:  # not loadable
        return Verdict(mutant.id, "(does not load)", str(exc), time.perf_counter() - start)
    finally:
        clear_caches(lesson)
    return Verdict(mutant.id, None, None, time.perf_counter() - start, survived=1)


def try_repeatedly(lesson: Lesson, mutant: GeneratedMutant, *, tries: int, fresh: bool) -> Verdict:
    """`try_generated` `tries` times: killed by the first property that failed in any try, and
    `survived` the number of tries in which none did."""
    verdicts = [try_generated(lesson, mutant, fresh=fresh) for _ in range(tries)]
    killed = next((v for v in verdicts if v.killed_by is not None), verdicts[0])
    return Verdict(
        mutant.id,
        killed.killed_by,
        killed.error,
        sum(v.seconds for v in verdicts),
        sum(v.survived for v in verdicts),
    )


def clear_caches(lesson: Lesson) -> None:
    """Forget what the lesson's checks cached from the engine (lesson 12's slot mappings): made
    with one mutant, or none, it is not what the next one computes."""
    for obj in vars(lesson_module(lesson, "test_exercise")).values():
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()


def _checks(lesson: Lesson) -> list[tuple[str, Any]]:
    from nanovllm.lessons import harness

    wanted = CHECKS.get(lesson.name)
    return [(n, p) for n, p in harness.properties(lesson) if wanted is None or n in wanted]


def sample(lesson: Lesson, size: int, seed: int = 0) -> list[GeneratedMutant]:
    """A fixed sample of the lesson's mutants (the same every run for the same code), with
    every one listed as equivalent."""
    pool = list(generate(lesson.name))
    listed = equivalents(lesson)
    chosen = random.Random(f"{lesson.name}:{seed}").sample(pool, min(size, len(pool)))
    return chosen + [m for m in pool if m.id in listed and m not in chosen]


def _child(lesson_name: str, skip: set[str], fresh: bool, tries: int) -> None:
    """In the child process: one JSON line per mutant ("start" before, the verdict after)."""
    import torch

    torch.set_num_threads(1)
    lesson = get_lesson(lesson_name)
    for mutant in generate(lesson.name):
        if mutant.id in skip:
            continue
        print(json.dumps({"start": mutant.id}), flush=True)
        verdict = try_repeatedly(lesson, mutant, tries=tries, fresh=fresh)
        print(json.dumps(asdict(verdict)), flush=True)


def run_lesson(
    lesson: Lesson,
    *,
    timeout_s: float = 120.0,
    fresh: bool = False,
    tries: int = 1,
    skip: frozenset[str] | set[str] = frozenset(),
    progress=None,
) -> dict[str, Verdict]:
    """Every generated mutant of `lesson` but those in `skip`, each tried `tries` times, run in a
    niced child process; a mutant that kills or hangs the child (past `timeout_s` a try with no
    verdict) counts as killed, and a new child carries on from the next one."""
    verdicts: dict[str, Verdict] = {}
    total = sum(m.id not in skip for m in generate(lesson.name))
    while len(verdicts) < total:
        command = [sys.executable, "-m", "nanovllm.lessons.mutation", "--child", lesson.name]
        command += ["--tries", str(tries)] + (["--fresh"] if fresh else [])
        child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.nice(10),
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(sorted(set(verdicts) | set(skip))))
        child.stdin.close()
        current = None
        started = time.monotonic()
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)
        while True:
            if not selector.select(timeout=1.0):
                if current is not None and time.monotonic() - started > timeout_s * tries:
                    child.kill()
                    break
                continue
            line = child.stdout.readline()
            if not line:
                break
            message = json.loads(line)
            if "start" in message:
                current, started = message["start"], time.monotonic()
            else:
                verdicts[message["id"]] = Verdict(**message)
                current = None
                if progress is not None:
                    progress(len(verdicts), total)
        child.wait()
        if current is not None:  # it crashed or hung on this one
            reason = "(hung)" if child.returncode == -9 else f"(crashed, {child.returncode})"
            verdicts[current] = Verdict(current, reason, None, 0.0)
        elif len(verdicts) < total:
            raise RuntimeError(f"the mutation run of {lesson.name} stopped ({child.returncode})")
    return verdicts


@dataclass
class LessonFigures:
    lesson: Lesson
    generated: int
    killed: int
    equivalent: int  # listed and surviving
    surviving: list[GeneratedMutant]  # neither killed nor listed
    listed_but_killed: list[str]  # listed as equivalent, yet a property kills them


def figures(lesson: Lesson, verdicts: dict[str, Verdict]) -> LessonFigures:
    pool = generate(lesson.name)
    listed = equivalents(lesson)
    killed = [m for m in pool if verdicts[m.id].killed_by is not None]
    survivors = [m for m in pool if verdicts[m.id].killed_by is None]
    return LessonFigures(
        lesson,
        len(pool),
        len(killed),
        sum(m.id in listed for m in survivors),
        [m for m in survivors if m.id not in listed],
        [m.id for m in killed if m.id in listed],
    )


def markdown(rows: list[LessonFigures]) -> str:
    """The table of `nanovllm lesson --mutate`, and each unlisted survivor as code."""
    lines = [
        "| lesson | generated | killed | equivalent (listed) | surviving |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.lesson.name} | {row.generated} | {row.killed} | {row.equivalent} | "
            f"{len(row.surviving)} |"
        )
    for row in rows:
        for mutant in row.surviving:
            lines += ["", f"{row.lesson.name} {mutant.id}:", "```diff", mutant.diff(), "```"]
        if row.listed_but_killed:
            lines += ["", f"{row.lesson.name}: listed as equivalent, yet killed (take them off the"]
            lines += [f"list): {', '.join(row.listed_but_killed)}"]
    return "\n".join(lines)


# --- fresh seeds ---------------------------------------------------------------------------------


@dataclass
class FreshFigures:
    lesson: Lesson
    tries: int
    tried: int  # mutants tried, `tries` times each
    survivors: list[tuple[GeneratedMutant, int]]  # each that survived a try, and in how many
    seconds: float


def fresh_sweep(
    lesson: Lesson, tries: int, *, only: set[str] | None = None, progress=None
) -> FreshFigures:
    """Every generated mutant of `lesson` not listed as equivalent (or those of `only`), each
    tried `tries` times with fresh random examples, as many learners' `--check`s would."""
    pool = generate(lesson.name)
    listed = equivalents(lesson)
    skip = {m.id for m in pool if (m.id not in only if only is not None else m.id in listed)}
    start = time.perf_counter()
    verdicts = run_lesson(lesson, fresh=True, tries=tries, skip=skip, progress=progress)
    survivors = [(m, verdicts[m.id].survived) for m in pool if m.id not in skip]
    return FreshFigures(
        lesson,
        tries,
        len(verdicts),
        [(m, n) for m, n in survivors if n],
        time.perf_counter() - start,
    )


def fresh_markdown(rows: list[FreshFigures]) -> str:
    """The table of `nanovllm lesson --mutate --fresh K`, and each survivor as code."""
    lines = [
        "| lesson | mutants tried | tries each | survived a try | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.lesson.name} | {row.tried} | {row.tries} | {len(row.survivors)} | "
            f"{row.seconds:.0f} |"
        )
    for row in rows:
        for mutant, survived in row.survivors:
            lines += [
                "",
                f"{row.lesson.name} {mutant.id}: survived {survived} of {row.tries} tries",
                "```diff",
                mutant.diff(),
                "```",
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        skip = set(json.loads(sys.stdin.read() or "[]"))
        tries = int(argv[argv.index("--tries") + 1]) if "--tries" in argv else 1
        _child(argv[1], skip, fresh="--fresh" in argv, tries=tries)
        return 0
    fresh = None
    if argv and argv[0] == "--fresh":
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
            got = repr(argv[1]) if len(argv) > 1 else "nothing"
            raise SystemExit(f"--fresh takes the number of tries, 1 or more; got {got}")
        fresh, argv = int(argv[1]), argv[2:]
    lessons = [get_lesson(a) for a in argv] if argv else list(all_lessons())
    if fresh is not None:
        swept = [fresh_sweep(lesson, fresh) for lesson in lessons]
        print(fresh_markdown(swept))
        return 0 if all(not row.survivors for row in swept) else 1
    rows = [figures(lesson, run_lesson(lesson)) for lesson in lessons]
    print(markdown(rows))
    return 0 if all(not r.surviving for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
