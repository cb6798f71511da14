"""`nanovllm lesson N --run`: your code inside the real engine, checked against the stock engine.

Two engines are built alike (the demo model, the lesson's options from its `run.py`); in one,
the lesson's `run.plug_in` swaps the learner's code in (see `plug.py`), or, where it must be there
before the model is built (lesson 14, in every tensor-parallel rank's process), `run.building`
does, around the engine's construction (see `plug_tensor_parallel.py`). The stock engine is
shut down before the learner's starts. Both serve the same requests (`workload.py`), and then:

- every completion is compared token for token (and, for lesson 10, its text). Greedy decoding
  is an argmax, and two engines that round differently (your attention is not the engine's) can
  pick different tokens where the two most likely are all but tied. So the stock engine also
  reports each position's two best log-probabilities: a divergence where they are within
  `NEAR_TIE` is a floating-point near-tie, reported as such; any other is a bug.
- what the lesson is about is compared too, where it is visible in the engine's events
  (`COMPARE` in `run.py`): every step's decisions for a scheduler, every block handed out and
  hit for the free block queue, every prefix-cache hit for the hashes, every verification
  (its proposals and how many were accepted) for speculative decoding.

The learner's engine's events can also be recorded (`record`), which is how `--run --viz` shows
your engine in the visualizer.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from contextlib import nullcontext
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
    decisions: str | None = None  # what was compared besides the tokens, in words
    decisions_differ: str | None = None  # the first difference, in words
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
            and self.decisions_differ is None
        )


def has_run(lesson: Lesson) -> bool:
    return lesson.file("run.py").is_file()


def run_lesson(
    lesson: Lesson, impl: Any, *, record: Path | None = None, workload: str | None = None
) -> RunReport:
    """Serve the lesson's workload with the stock engine and with `impl` plugged in; compare."""
    from nanovllm.lessons.demo_support import make_engine

    spec = lesson_module(lesson, "run")
    arrivals = make_workload(workload or spec.WORKLOAD)
    compare = getattr(spec, "COMPARE", None)

    stock = make_engine(**spec.ENGINE)
    stock_events: list = []
    stock.subscribe(stock_events.append)
    start = time.perf_counter()
    try:
        stock_out = serve(stock, arrivals, logprobs=2)
        stock_seconds = time.perf_counter() - start
    finally:
        # Its tensor-parallel workers, if any, go first: a process leads one group at a time.
        stock.shutdown()

    # `building(impl)`, when run.py has it: a context in which the engine is built with the
    # learner's code (lesson 14's goes into every rank's process before the model is loaded).
    building = getattr(spec, "building", None)
    report = RunReport(lesson, [], stock_seconds=stock_seconds)
    your_events: list = []
    yours = None
    try:
        with building(impl) if building is not None else nullcontext():
            yours = make_engine(**spec.ENGINE)
        report.swapped = list(spec.plug_in(yours, impl))
        yours.subscribe(your_events.append)
        start = time.perf_counter()
        your_out = serve(yours, arrivals)
        report.seconds = time.perf_counter() - start
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
    _compare_completions(report, stock_out, your_out, text=compare == "text")
    if compare == "text":
        report.decisions = "every completion's text"
    elif compare in DECISIONS:
        what, extract = DECISIONS[compare]
        report.decisions = what
        report.decisions_differ = first_difference(extract(stock_events), extract(your_events))
    return report


def record_stock(lesson: Lesson, path: Path) -> list:
    """Serve the lesson's workload with the stock engine, writing its events to `path`."""
    from nanovllm.lessons.demo_support import make_engine

    spec = lesson_module(lesson, "run")
    engine = make_engine(**spec.ENGINE)
    events: list = []
    engine.subscribe(events.append)
    try:
        serve(engine, make_workload(spec.WORKLOAD))
    finally:
        engine.shutdown()
        write_events(path, events)
    return events


def serve(engine, arrivals: list[Arrival], logprobs: int | None = None) -> dict[str, Any]:
    """Add each request before the step it arrives at; step until all are done. Returns the
    final `RequestOutput` of each request."""
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


# --- what else is compared -------------------------------------------------------------------


def _schedule(events: list) -> list:
    out = []
    for e in events:
        name = type(e).__name__
        if name == "StepSummary":
            out.append((f"step {e.step}", "scheduled", tuple(e.scheduled.items())))
        elif name == "RequestPreempted":
            out.append((f"step {e.step}", "preempted", e.request_id))
    return out


def _blocks(events: list) -> list:
    kinds = {"BlockAllocated": "took", "BlockFreed": "freed", "CacheHit": "hit"}
    return [
        (e.request_id, kinds[type(e).__name__], f"block {e.block_id}")
        for e in events
        if type(e).__name__ in kinds
    ]


def _cache_hits(events: list) -> list:
    return [
        (e.request_id, "hit", f"block {e.block_id} as its block {e.logical_index}")
        for e in events
        if type(e).__name__ == "CacheHit"
    ]


def _verifications(events: list) -> list:
    return [
        (
            f"step {e.step}",
            e.request_id,
            f"proposed {list(e.proposed)}",
            f"accepted {e.num_accepted}",
        )
        for e in events
        if type(e).__name__ == "SpecTokensVerified"
    ]


def acceptance(events: list) -> tuple[int, int, int]:
    """Speculative decoding in a run's events: (verifications, proposed tokens, accepted)."""
    verified = [e for e in events if type(e).__name__ == "SpecTokensVerified"]
    return (
        len(verified),
        sum(len(e.proposed) for e in verified),
        sum(e.num_accepted for e in verified),
    )


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


DECISIONS = {
    "schedule": ("every step's scheduling decisions", _schedule),
    "blocks": ("every block handed out, freed and hit", _blocks),
    "cache_hits": ("every prefix-cache hit", _cache_hits),
    "verifications": ("every verification (its proposals, how many accepted)", _verifications),
}


def first_difference(stock: list, yours: list) -> str | None:
    """The first entry where the two lists differ, in words (None: they are equal)."""
    for i, (a, b) in enumerate(zip(stock, yours)):
        if a != b:
            return f"#{i + 1}: the stock engine: {' '.join(map(str, a))}; yours: {' '.join(map(str, b))}"
    if len(stock) != len(yours):
        longer, who = (stock, "the stock engine") if len(stock) > len(yours) else (yours, "yours")
        extra = longer[min(len(stock), len(yours))]
        return f"#{min(len(stock), len(yours)) + 1}: only {who} has {' '.join(map(str, extra))}"
    return None


def describe_error(exc: BaseException, impl: Any) -> str:
    """The error, and the last line of the learner's file it came through, if any. A worker
    process of tensor parallelism that failed is described by the last line of its traceback."""
    import traceback

    from nanovllm.distributed import WorkerDiedError
    from nanovllm.lessons.report import last_line_in

    if isinstance(exc, WorkerDiedError):
        lines = [line.strip() for line in exc.reason.splitlines() if line.strip()]
        last = lines[-1] if lines else exc.reason
        last = re.sub(r"^(?:\w+\.)+(?=\w+: )", "", last)  # the exception's name, without modules
        return f"tensor-parallel rank {exc.rank} failed: {last}"
    path = getattr(impl, "__file__", None)
    where = last_line_in(exc, Path(path)) if path else None
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[0]
    return message + (f" (in your {where})" if where else "")


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
    if report.passed:
        also = f", and {report.decisions} matched" if report.decisions else ""
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
    console.print(f"[red]✗ {same} of {n} completions are the same as the stock engine's[/]")
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
    if report.decisions_differ:
        console.print(f"  {report.decisions} differ, first at {escape(report.decisions_differ)}")
