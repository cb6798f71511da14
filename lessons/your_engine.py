"""`nanovllm lesson N --run`: your code inside the real engine, checked against the stock engine.

Two engines are built alike (the demo model, the lesson's options from its `run.py`); the
learner's is built from the parts the lesson's `run.plug_in(impl)` returns (`EngineParts`, with
the learner's code in one of them: see `plug.py`, and for lesson 14, whose part goes to every
tensor-parallel rank's process, `plug_tensor_parallel.py`). `run.swapped(engine)` then says, in words, what of the built
engine is the learner's (and refuses an engine built without it). The stock engine is built
from the engine's own parts (`run.stock_parts()`, where a lesson asks about one of them once
the run is done). The stock engine is shut down before the learner's starts. Both serve the same requests (`workload.py`), and then:

- every completion is compared token for token (and, for lesson 10, its text). Greedy decoding
  is an argmax, and two engines that round differently (your attention is not the engine's) can
  pick different tokens where the two most likely are all but tied. So the stock engine also
  reports each position's two best log-probabilities: a divergence where they are within
  `NEAR_TIE` is a floating-point near-tie, reported as such; any other is a bug.
- what the lesson is about is compared too, step by step, from the engine's events
  (`COMPARE` in `run.py`, `compare.py`): each step's scheduling decisions for a scheduler,
  every block handed out, hit and given back (and the free queue's count) for block tables and
  the free block queue, every prefix-cache hit for the hashes, every verification (its
  proposals and how many were accepted) for speculative decoding, every block saved to the host
  tier, dropped from it and loaded back for the tier. The report names the first
  step where your engine decided otherwise, and what it decided.
- whatever the lesson, what every run keeps (`compare.broken_invariant`): no step gives a
  request 0 tokens, and blocks are conserved (none given back by a request that does not hold
  it, none handed to two requests, the held and the free ones always all the cache's blocks).
- where the lesson's code guards against a mistake the engine never makes (a double free),
  `run.py`'s `after_serving` tries that mistake on both engines once they are idle, and what
  each did is compared.

Where the learner's code draws its own random numbers (lesson 13's `verify_random`), a sampled
request's tokens cannot be compared one for one (`YOUR_DRAWS` in `run.py`): the plug checks
each of its verifications against what the rule can emit instead, and the greedy requests are
compared as usual.

Your engine's run has a deadline (`RUN_DEADLINE_S`): a loop in your code that never ends is
stopped, and said to be.

The learner's engine's events can also be recorded (`record`), which is how `--run --viz` shows
your engine in the visualizer.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanovllm.lessons.catalog import Lesson, lesson_module
from nanovllm.lessons.workload import Arrival, make_workload

# Log-probability gap under which two tokens count as tied. Measured: a learner's attention
# (lessons 01 and 04) moves the demo model's log-probabilities by at most 4e-6; a real
# difference in the computation moves them by far more.
NEAR_TIE = 1e-3
MAX_NEAR_TIES = 3  # more divergences than this, tied or not, are a bug
RUN_DEADLINE_S = 600.0  # your engine's whole run (building it, serving, `after_serving`)


@dataclass
class Divergence:
    request_id: str
    position: int  # index into the output tokens
    stock_token: int | None
    your_token: int | None
    gap: float | None = None  # stock engine's log-prob gap between its two best tokens there


@dataclass
class RunReport:
    lesson: Lesson
    swapped: list[str]  # what of the engine was the learner's, in words
    num_completions: int = 0
    num_tokens: int = 0
    divergences: list[Divergence] = field(default_factory=list)  # real ones
    near_ties: list[Divergence] = field(default_factory=list)
    texts_differ: list[str] = field(default_factory=list)  # request ids
    decisions: list[str] = field(default_factory=list)  # compared besides tokens, in words
    differences: list[str] = field(default_factory=list)  # the first of each, in words
    num_rule_checked: int = 0  # sampled requests checked by the rule, not token for token
    stats: Counter = field(default_factory=Counter)  # events of your engine by kind
    seconds: float = 0.0  # your engine's run
    stock_seconds: float = 0.0
    error: str | None = None  # your code raised, or did something the engine cannot do
    events: list = field(default_factory=list, repr=False)  # your engine's, in order

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and not self.divergences
            and not self.texts_differ
            and not self.differences
        )

    @property
    def decisions_differ(self) -> str | None:
        """The first difference in what was compared besides the tokens (None: none)."""
        return self.differences[0] if self.differences else None


def has_run(lesson: Lesson) -> bool:
    return lesson.file("run.py").is_file()


def run_lesson(
    lesson: Lesson, impl: Any, *, record: Path | None = None, workload: str | None = None
) -> RunReport:
    """Serve the lesson's workload with the stock engine and with `impl` plugged in; compare.

    Nothing here checks `impl` first: `nanovllm lesson N --run` does, before it calls this."""
    from nanovllm.lessons import compare
    from nanovllm.lessons.demo_support import make_engine
    from nanovllm.lessons.harness import ExampleTimeout, deadline

    spec = lesson_module(lesson, "run")
    arrivals = make_workload(workload or spec.WORKLOAD)
    aspects = _aspects(getattr(spec, "COMPARE", None))
    after_serving = getattr(spec, "after_serving", None)
    # Requests whose tokens are compared one for one: all, unless your code draws its own.
    compared = {a.request_id for a in arrivals}
    if getattr(spec, "YOUR_DRAWS", False):
        compared = {a.request_id for a in arrivals if a.seed is None}

    # Steps before which the prefix cache is reset (`RESET_PREFIX_CACHE_AT` in run.py), in both
    # engines: a run that must reach the code that forgets (lesson 15's `clear`).
    resets = tuple(getattr(spec, "RESET_PREFIX_CACHE_AT", ()))
    stock = make_engine(**engine_options(spec), **stock_parts(spec))
    stock_events: list = []
    stock.subscribe(stock_events.append)
    start = time.perf_counter()
    try:
        stock_out = serve(stock, arrivals, logprobs=2, resets=resets)
        stock_seconds = time.perf_counter() - start
        stock_after = after_serving(stock) if after_serving is not None else []
    finally:
        # Its tensor-parallel workers, if any, go first: a process leads one group at a time.
        stock.shutdown()

    # `plug_in(impl)`: the engine's parts, the learner's among them.
    plug_in = getattr(spec, "plug_in", None)
    report = RunReport(lesson, [], stock_seconds=stock_seconds)
    your_events: list = []
    yours = None
    try:
        with deadline(RUN_DEADLINE_S):
            parts = {} if plug_in is None else dict(parts=plug_in(impl))
            yours = make_engine(**engine_options(spec), **parts)
            report.swapped = list(spec.swapped(yours))
            yours.subscribe(your_events.append)
            start = time.perf_counter()
            your_out = serve(yours, arrivals, resets=resets)
            report.seconds = time.perf_counter() - start
            your_after = after_serving(yours) if after_serving is not None else []
    except ExampleTimeout as exc:
        report.error = (
            f"your engine ran past its deadline of {RUN_DEADLINE_S:g} s and was stopped: "
            "does a loop in your code never end?" + _in_your_file(exc, impl)
        )
        return report
    except Exception as exc:  # noqa: BLE001 - the learner's code can fail in any way
        report.error = describe_error(exc, impl)
        return report
    finally:
        if yours is not None:
            yours.shutdown()
        if record is not None:
            write_events(record, your_events)
    report.events = your_events
    report.stats = Counter(type(e).__name__ for e in your_events)
    stock_out = {rid: out for rid, out in stock_out.items() if rid in compared}
    report.num_rule_checked = len(arrivals) - len(compared)
    _compare_completions(report, stock_out, your_out, text="text" in aspects)
    report.decisions = [compare.described(aspect) for aspect in aspects]
    for aspect in (aspect for aspect in aspects if aspect != "text"):
        found = compare.first_difference(aspect, stock_events, your_events, compared)
        if found is not None:
            report.differences.append(f"{compare.described(aspect)} differ, first {found}")
    # Whatever the lesson, your engine keeps what every run keeps (checked on the stock run
    # too: a rule the stock engine breaks would be this check's mistake, not yours).
    broken = compare.broken_invariant(your_events)
    if broken is not None and compare.broken_invariant(stock_events) is None:
        report.differences.append(f"{compare.INVARIANTS} broke, first {broken}")
    if after_serving is not None:
        report.decisions.append(spec.AFTER_SERVING)
        found = compare.first_listed_difference(stock_after, your_after, "after the run")
        if found is not None:
            report.differences.append(f"{spec.AFTER_SERVING} differs, {found}")
    return report


def engine_options(spec: Any) -> dict[str, Any]:
    """Both engines' options: a run.py's `ENGINE`, and the checkpoint its `model()` gives
    (lesson 16's: the demo model with a sliding window), if it has one."""
    model = getattr(spec, "model", None)
    return dict(spec.ENGINE) if model is None else dict(spec.ENGINE, model=str(model()))


def stock_parts(spec: Any) -> dict[str, Any]:
    """The stock engine's `parts` option: the engine's own, kept where `after_serving` asks
    about one of them (`run.stock_parts()`, `plug.KeptPart`); none given otherwise."""
    parts = getattr(spec, "stock_parts", None)
    return {} if parts is None else dict(parts=parts())


def _aspects(compare: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """`COMPARE` of a run.py (None, one aspect, or several) as a tuple."""
    if compare is None:
        return ()
    return (compare,) if isinstance(compare, str) else tuple(compare)


def record_stock(lesson: Lesson, path: Path) -> list:
    """Serve the lesson's workload with the stock engine, writing its events to `path`."""
    from nanovllm.lessons.demo_support import make_engine

    spec = lesson_module(lesson, "run")
    engine = make_engine(**engine_options(spec), **stock_parts(spec))
    events: list = []
    engine.subscribe(events.append)
    try:
        serve(
            engine,
            make_workload(spec.WORKLOAD),
            resets=tuple(getattr(spec, "RESET_PREFIX_CACHE_AT", ())),
        )
    finally:
        engine.shutdown()
        write_events(path, events)
    return events


def serve(
    engine, arrivals: list[Arrival], logprobs: int | None = None, resets: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Add each request before the step it arrives at; step until all are done. Returns the
    final `RequestOutput` of each request. Before each step in `resets`, the prefix cache is
    reset (`LLMEngine.reset_prefix_cache`; RuntimeError if the engine refuses, as it does while
    a block is in use: a reset must be put where a wave has finished)."""
    from nanovllm.sampling_params import SamplingParams

    pending = sorted(arrivals, key=lambda a: a.step)
    finished: dict[str, Any] = {}
    tick = 0
    # Far more steps than serving them one at a time would take: a scheduler that stops
    # scheduling must end the run, not hang it.
    max_ticks = max((a.step for a in arrivals), default=0) + 4 * sum(
        len(a.prompt) + a.max_tokens for a in arrivals
    )
    while pending or engine.has_unfinished_requests():
        if tick > max_ticks:
            raise RuntimeError(
                f"not finished after {tick} steps: requests are waiting that are never scheduled"
            )
        if tick in resets and not engine.reset_prefix_cache():
            raise RuntimeError(f"the prefix cache could not be reset before step {tick}")
        while pending and pending[0].step <= tick:
            a = pending.pop(0)
            # ignore_eos: every request as long as the workload planned, in both engines.
            common = dict(max_tokens=a.max_tokens, ignore_eos=True, logprobs=logprobs)
            if a.seed is None:
                params = SamplingParams(temperature=0.0, **common)
            else:
                params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=a.seed, **common)
            engine.add_request(a.request_id, a.prompt, params)
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        tick += 1
    return finished


def _compare_completions(report: RunReport, stock: dict, yours: dict, *, text: bool) -> None:
    report.num_completions = len(stock)
    for rid, want in stock.items():
        got = yours.get(rid)
        want_ids = list(want.outputs[0].token_ids)
        report.num_tokens += len(want_ids)
        if got is None:
            report.divergences.append(Divergence(rid, 0, want_ids[0] if want_ids else None, None))
            continue
        got_ids = list(got.outputs[0].token_ids)
        if got_ids != want_ids:
            pos = next(
                (i for i, (a, b) in enumerate(zip(want_ids, got_ids)) if a != b),
                min(len(want_ids), len(got_ids)),
            )
            div = Divergence(
                rid,
                pos,
                want_ids[pos] if pos < len(want_ids) else None,
                got_ids[pos] if pos < len(got_ids) else None,
                _gap(want.outputs[0].logprobs, pos),
            )
            tied = div.gap is not None and div.gap < NEAR_TIE
            (report.near_ties if tied else report.divergences).append(div)
        elif text and got.outputs[0].text != want.outputs[0].text:
            report.texts_differ.append(rid)
    if len(report.near_ties) > MAX_NEAR_TIES:  # that many is not rounding
        report.divergences.extend(report.near_ties)
        report.near_ties.clear()


def _gap(logprobs: list | None, pos: int) -> float | None:
    """The log-prob gap between the two most likely tokens at `pos` (None if unknown)."""
    if not logprobs or pos >= len(logprobs):
        return None
    values = sorted((lp.logprob for lp in logprobs[pos].values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


# --- what the report says besides the comparison ------------------------------------------


def acceptance(events: list) -> tuple[int, int, int]:
    """Speculative decoding in a run's events: (verifications, proposed tokens, accepted)."""
    verified = [e for e in events if type(e).__name__ == "SpecTokensVerified"]
    return (
        len(verified),
        sum(len(e.proposed) for e in verified),
        sum(e.num_accepted for e in verified),
    )


def tier_use(events: list) -> tuple[int, int, int, int]:
    """The host tier in a run's events: (blocks saved, loaded back, dropped, and the tokens
    those loads spared computing)."""
    kinds = Counter(type(e).__name__ for e in events)
    started = next((e for e in events if type(e).__name__ == "EngineStarted"), None)
    block_size = started.block_size if started is not None else 0
    loaded = kinds["KVBlockLoaded"]
    return kinds["KVBlockSaved"], loaded, kinds["KVTierEvicted"], loaded * block_size


def rank_forward_means(events: list) -> tuple[float, ...]:
    """Each tensor-parallel rank's mean forward time per step (seconds, in rank order), from
    the step summaries; () when the engine ran on one rank."""
    started = next((e for e in events if type(e).__name__ == "EngineStarted"), None)
    if started is None or started.tensor_parallel_size < 2:
        return ()
    times = [e.rank_forward_times for e in events if type(e).__name__ == "StepSummary"]
    times = [t for t in times if len(t) == started.tensor_parallel_size]
    if not times:
        return ()
    return tuple(sum(column) / len(times) for column in zip(*times))


def describe_error(exc: BaseException, impl: Any) -> str:
    """The error (a failed allocation in words), and the last line of the learner's file it came
    through, if any. A worker process of tensor parallelism that failed is described by the
    last line of its traceback."""
    from nanovllm.distributed import WorkerDiedError
    from nanovllm.lessons.report import plain_message

    if isinstance(exc, WorkerDiedError):
        lines = [line.strip() for line in exc.reason.splitlines() if line.strip()]
        last = lines[-1] if lines else exc.reason
        last = re.sub(r"^(?:\w+\.)+(?=\w+: )", "", last)  # the exception's name, without modules
        return f"tensor-parallel rank {exc.rank} failed: {last}"
    return plain_message(exc).splitlines()[0] + _in_your_file(exc, impl)


def _in_your_file(exc: BaseException, impl: Any) -> str:
    """ " (in your FILE, line N, in FUNCTION)": the last line of the learner's file that `exc`
    came through, or "" when it came through none."""
    from nanovllm.lessons.report import last_line_in

    path = getattr(impl, "__file__", None)
    where = last_line_in(exc, Path(path)) if path else None
    return f" (in your {where})" if where else ""


def write_events(path: Path, events: list) -> None:
    """The events as a trace: one JSON object per line (`nanovllm viz --replay` plays it)."""
    from nanovllm.events import event_to_dict

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event_to_dict(event), ensure_ascii=False) + "\n")


# --- rendering ---------------------------------------------------------------------------------


def render(console, report: RunReport) -> None:
    from rich.markup import escape

    from nanovllm.lessons import compare

    if report.swapped:  # empty when the engine could not be built with your code
        console.print("Yours in the engine: " + "; ".join(escape(s) for s in report.swapped))
    if report.error is not None:
        console.print(f"[red]✗ Your engine stopped:[/] {escape(report.error)}")
        return
    s = report.stats
    facts = [f"{s['StepSummary']} steps"]
    for kind, words in (
        ("RequestPreempted", "preemptions"),
        ("CacheHit", "prefix-cache hits"),
        ("BlockAllocated", "blocks handed out"),
    ):
        if s[kind]:
            facts.append(f"{s[kind]} {words}")
    saved, loaded, dropped, tokens = tier_use(report.events)
    if saved or loaded:
        facts.append(
            f"{saved} blocks saved to the host tier, {dropped} dropped from it, {loaded} loaded "
            f"back: {tokens} prompt tokens not computed"
        )
    ranks = rank_forward_means(report.events)
    if ranks:
        each = " / ".join(f"{t * 1e3:.1f}" for t in ranks)
        facts.append(f"{len(ranks)} tensor-parallel ranks, forward {each} ms per step")
    drafts, proposed, accepted = acceptance(report.events)
    if drafts:
        facts.append(
            f"{proposed} tokens proposed in {drafts} verifications, {accepted} accepted "
            f"({accepted / proposed:.0%}; {1 + accepted / drafts:.2f} tokens per verifying step)"
        )
    n, total = report.num_completions, report.num_tokens
    same = n - len(report.divergences) - len(report.near_ties) - len(report.texts_differ)
    checked = report.num_rule_checked
    if checked:
        facts.append(f"{checked} sampled requests' verifications checked against the rule")
    if report.passed:
        also = f", and {' and '.join(report.decisions)} matched" if report.decisions else ""
        also += f"; {compare.INVARIANTS} held"
        console.print(
            f"[green]✓ Your engine produced the same {same} completions as the stock engine[/] "
            f"({total} tokens{also}; {', '.join(facts)}; {report.seconds:.1f} s)"
        )
        for d in report.near_ties:
            console.print(
                f"  [yellow]~[/] {d.request_id} parted at token {d.position} where the stock "
                f"engine's two best tokens were {d.gap:.1e} apart in log-probability: a "
                "floating-point near-tie (your arithmetic rounds differently), not a bug"
            )
        return
    colour = "red" if same < n else "green"
    console.print(f"[{colour}]{same} of {n} completions are the same as the stock engine's[/]")
    for d in report.divergences[:5]:
        gap = f" (its two best were {d.gap:.2g} apart)" if d.gap is not None else ""
        console.print(
            f"  {d.request_id}: token {d.position} is {d.your_token}, the stock engine's is "
            f"{d.stock_token}{gap}"
        )
    if len(report.divergences) > 5:
        console.print(f"  ... and {len(report.divergences) - 5} more")
    for rid in report.texts_differ[:5]:
        console.print(f"  {rid}: the same tokens, but a different text")
    for difference in report.differences:
        console.print(f"[red]✗ Your engine decided otherwise:[/] {escape(difference)}")
