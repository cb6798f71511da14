"""AsyncLLMEngine: one thread owns the engine; every asyncio client shares it.

The `LLMEngine` is synchronous and not thread-safe, and a step is heavy compute. So one
background thread owns it outright and runs the loop below; HTTP handlers on the asyncio event
loop never touch it, they only send commands and receive outputs:

    event loop (HTTP handlers)                      engine thread
    ──────────────────────────                      ─────────────
    add_request() ──┐                               while True:
    stream.abort() ─┼──> command queue ──────────>    take commands (block when idle)
    subscribe_events()                                add / abort / (un)subscribe
                                                      step()  -> outputs, events
    RequestStream  <── loop.call_soon_threadsafe ──   deliver, publish stats

- Every request that arrives between two steps joins the next step: that is continuous
  batching across HTTP clients, for free, because the engine already batches whatever it holds.
- Outputs go back through `loop.call_soon_threadsafe` into a per-request `asyncio.Queue`,
  once per step for each event loop (not once per token), so the event loop wakes up once.
- The step runs off the event loop thread, so `/health`, `/metrics` and new connections stay
  responsive while the model computes. (PyTorch releases the GIL inside its kernels.)
- An abort (a client that went away) frees the request's KV blocks before the next step.
- Metrics are read from an immutable `ServerStats` snapshot the engine thread publishes after
  every iteration, so nothing outside the thread reads the engine's changing state. Per-request
  latencies (time to first token, inter-token, queue, end to end: stats.py) are measured on the
  engine thread and handed after every step to the observers of `add_stats_observer`.

If a step raises, every request in flight fails with `EngineError` and is aborted (its blocks
are freed), and the loop goes on serving new requests. A tensor-parallel rank that dies is
different: the engine can never step again, so the thread stops and every request, in flight or
new, fails with `EngineDeadError` (the server's 503 `engine_unavailable`). The worker group's
monitor notices a death at once, so `is_alive` turns false even while the engine is idle.
`fail_requests(error)` ends every request in flight with `error` and keeps the engine serving:
a draining server's last word to the streams its window could not finish (server.py).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from nanovllm.distributed import WorkerGroupError
from nanovllm.engine.llm_engine import LLMEngine, Prompt
from nanovllm.engine.outputs import RequestOutput
from nanovllm.events import Event
from nanovllm.request import Request
from nanovllm.sampling_params import SamplingParams
from nanovllm.serve.stats import IterationStats, RequestTimer

logger = logging.getLogger("nanovllm.serve")

RATE_WINDOW_S = 10.0  # tokens/s is averaged over this many seconds
# With work waiting, an engine thread that has made no step for this long is stalled (`/health`
# answers 503). A step of the largest prefill on a CPU takes seconds, far below it.
STALL_TIMEOUT_S = 60.0
MAX_PENDING_EVENTS = 200_000  # an event listener further behind than this is cut off


class EngineError(RuntimeError):
    """The engine failed while running a request (the request has been aborted)."""


class EngineDeadError(EngineError):
    """The engine thread has stopped; no request can be served."""


class ServerShutdownError(EngineError):
    """The server is shutting down and cut the request before it finished (`fail_requests`)."""


@dataclass(frozen=True)
class ServerStats:
    """A consistent snapshot of the engine and the server, published by the engine thread (the
    engine's own figures come from `LLMEngine.stats`, `engine/stats.py`)."""

    model: str = ""
    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks: int = 0
    num_used_blocks: int = 0
    num_cached_free_blocks: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # ... and found there
    external_prefix_cache_hits: int = 0  # prompt tokens a KV connector supplied
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps: int = 0
    num_engine_errors: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    num_event_subscribers: int = 0
    # (whole second, tokens generated in it) for the last RATE_WINDOW_S seconds.
    token_buckets: tuple[tuple[int, int], ...] = ()
    started_at: float = field(default_factory=time.time)
    # Speculative decoding (the engine's `stats.spec_decoding`): k, 0 when the engine does not speculate.
    num_speculative_tokens: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0

    def tokens_per_second(self, now: float | None = None) -> float:
        """Generated tokens per second over the last RATE_WINDOW_S (less just after start)."""
        now = time.time() if now is None else now
        window = min(RATE_WINDOW_S, max(now - self.started_at, 1.0))
        recent = sum(n for second, n in self.token_buckets if second >= now - window)
        return recent / window


class RequestStream:
    """The outputs of one request, as an async iterator; ends after the finished output.

    Leaving early (client gone, handler cancelled) must call `abort()`, which is idempotent
    and a no-op once the request has finished.
    """

    def __init__(self, engine: AsyncLLMEngine, request_id: str) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def _put(self, item: RequestOutput | BaseException) -> None:  # event loop thread
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def drain_ready(self) -> list[RequestOutput]:
        """Outputs already queued (no waiting): lets a slow client catch up in one write."""
        ready = []
        while not self.finished and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, BaseException):
                self._queue.put_nowait(item)  # raised by the next __anext__
                break
            ready.append(item)
            self.finished = item.finished
        return ready

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class EventStream:
    """Engine events for one listener, delivered in batches (one batch per engine iteration)."""

    def __init__(self, engine: AsyncLLMEngine, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self._engine = engine
        self._pending: deque[Event] = deque()
        self._wakeup = asyncio.Event()
        self._max_pending = max_pending
        self.overflowed = False  # the listener fell too far behind and was cut off
        self.closed = False

    def _push(self, batch: list[Event]) -> None:  # event loop thread
        if self.closed or self.overflowed:
            return
        self._pending.extend(batch)
        if len(self._pending) > self._max_pending:
            self.overflowed = True
            self._pending.clear()
        self._wakeup.set()

    async def next_batch(self, timeout: float | None = None) -> list[Event]:
        """The events that arrived since the last call ([] on timeout)."""
        if not self._pending and not self.overflowed:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                return []
        self._wakeup.clear()
        batch = list(self._pending)
        self._pending.clear()
        return batch

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._engine._send(_Unsubscribe(self))


# --- commands, from any thread to the engine thread ---------------------------------------------


@dataclass
class _Add:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    stream: RequestStream
    loop: asyncio.AbstractEventLoop
    accepted: asyncio.Future
    arrival: float  # time.monotonic() when add_request was called


@dataclass
class _Abort:
    request_id: str


@dataclass
class _FailAll:
    error: BaseException
    unstarted_only: bool = False


@dataclass
class _Subscribe:
    sink: EventStream
    loop: asyncio.AbstractEventLoop


@dataclass
class _Unsubscribe:
    sink: EventStream


class _Stop:
    pass


@dataclass
class _Barrier:
    done: threading.Event


@dataclass
class _Sink:
    """The engine thread's side of an event listener: events gathered during one iteration."""

    loop: asyncio.AbstractEventLoop
    buffer: list[Event] = field(default_factory=list)
    unsubscribe: object = None


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:  # event loop thread
    if future.done():  # the caller gave up waiting (cancelled)
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _deliver(items: list[tuple[RequestStream, RequestOutput | BaseException]]) -> None:
    for stream, item in items:
        stream._put(item)


class AsyncLLMEngine:
    """Share one `LLMEngine` among asyncio tasks (from any number of event loops)."""

    def __init__(
        self, engine: LLMEngine, start: bool = True, stall_timeout_s: float = STALL_TIMEOUT_S
    ) -> None:
        self.engine = engine
        self.stall_timeout_s = stall_timeout_s
        # The engine thread's heartbeat: when it last woke with work or ended a step, and
        # whether it now sleeps for want of work (then no heartbeat is due).
        self._beat = time.monotonic()
        self._sleeping = True
        self.model_name = engine.started_event.model
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Owned by the engine thread only:
        self._streams: dict[str, tuple[RequestStream, asyncio.AbstractEventLoop]] = {}
        # Each request's `n`: its completions count as n requests in `request_success`, as
        # vLLM counts its n child requests.
        self._num_completions: dict[str, int] = {}
        self._sinks: dict[EventStream, _Sink] = {}
        self._finished: Counter[str] = Counter()
        # Adds whose grammar still compiles: accepted (their caller answered) once it has.
        self._awaiting_grammar: list[tuple[_Add, Request]] = []
        self._has_output: set[str] = set()  # requests whose stream has had an output
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._num_steps = 0
        self._num_errors = 0
        self._buckets: deque[list[int]] = deque()  # [second, tokens]
        self._timer = RequestTimer()
        # Replaced, never mutated, so the engine thread can iterate it while a handler adds one.
        self._stats_observers: tuple[Callable[[IterationStats], None], ...] = ()
        self._started_at = time.time()
        self._dead: BaseException | None = None
        # Held while an add is checked and queued, and while the thread is declared dead: so an
        # add either sees the death or is queued before it, and then refused by `_run`.
        self._door = threading.Lock()
        self.stats = ServerStats(model=self.model_name, started_at=self._started_at)
        self._publish_stats()
        self._thread = threading.Thread(target=self._run, name="nanovllm-engine", daemon=True)
        if start:
            self.start()

    # --- the asyncio side -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self.dead_reason() is None

    async def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
    ) -> RequestStream:
        """Queue a request; returns once the engine has accepted it.

        A prompt given as text is tokenized on the engine thread, holding up every step: the
        server (serving.py) hands token ids only, tokenized on its own thread. Raises the
        engine's `ValueError` (naming the bad value) if it was refused, or `EngineDeadError` if
        the engine is gone.
        """
        arrival = time.monotonic()
        loop = asyncio.get_running_loop()
        stream = RequestStream(self, request_id)
        accepted = loop.create_future()
        with self._door:
            self._check_alive()
            self._send(_Add(request_id, prompt, params, stream, loop, accepted, arrival))
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)  # the caller left before we answered: don't run it
            raise
        return stream

    async def generate(
        self, request_id: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs; closing the generator early aborts it.

        To leave early, use `async with contextlib.aclosing(engine.generate(...)) as outputs:`
        so the abort happens at once rather than whenever the generator is garbage-collected.
        """
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe, idempotent); its blocks are freed before the next step."""
        self._send(_Abort(request_id))

    def fail_requests(self, error: BaseException, unstarted_only: bool = False) -> None:
        """Abort every request in flight (thread-safe): each stream gets `error`, its blocks are
        freed. The engine goes on serving new requests. (A draining server's last word.) With
        `unstarted_only`, only those that have had no output yet: a draining server's word to
        the requests it would otherwise make wait, so their clients retry elsewhere at once."""
        self._send(_FailAll(error, unstarted_only))

    def subscribe_events(self) -> EventStream:
        """Start receiving engine events; the first is `EngineStarted`. `close()` to stop."""
        self._check_alive()
        sink = EventStream(self)
        self._send(_Subscribe(sink, asyncio.get_running_loop()))
        return sink

    def add_stats_observer(self, fn: Callable[[IterationStats], None]) -> Callable[[], None]:
        """Call `fn(stats)` on the engine thread after every step that changed the per-request
        statistics (stats.py). `fn` must be quick and thread-safe; what it raises is logged.
        Returns the function that removes it."""
        self._stats_observers = (*self._stats_observers, fn)

        def remove() -> None:
            self._stats_observers = tuple(f for f in self._stats_observers if f is not fn)

        return remove

    def sync(self, timeout: float | None = 30.0) -> bool:
        """Wait (blocking) until the engine thread has handled every command sent before this
        call and published `stats` after them. False on timeout or if the thread is gone.

        `stats` alone can be one iteration old: a client may already hold an output whose step
        is not in the snapshot yet. Tests call this before trusting `stats`.
        """
        if not self._thread.is_alive():
            return False
        done = threading.Event()
        self._send(_Barrier(done))
        return done.wait(timeout) and self.is_alive

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (and the engine's tensor-parallel workers); requests still in
        flight fail with `EngineDeadError`."""
        if self._thread.is_alive():
            self._send(_Stop())
            self._thread.join(timeout)
        self.engine.shutdown()

    def _send(self, command: object) -> None:
        self._commands.put(command)

    def _check_alive(self) -> None:
        reason = self.dead_reason()
        if reason is not None:
            raise EngineDeadError(reason)

    def stall_reason(self) -> str | None:
        """Why the engine is stuck (None: it is not): it has work, yet has made no step for
        longer than `stall_timeout_s` (a step that never returns, a thread that hangs)."""
        beat, sleeping = self._beat, self._sleeping
        quiet = time.monotonic() - beat
        if sleeping or quiet <= self.stall_timeout_s:
            return None
        return (
            f"the engine has made no step for {quiet:.1f} s while it has work "
            f"(the bound: {self.stall_timeout_s:g} s)"
        )

    def has_stopped(self) -> bool:
        """Whether the engine thread has ended, having failed every request it was serving."""
        return not self._thread.is_alive()

    def dead_reason(self) -> str | None:
        """Why no request can be served (None: the engine runs)."""
        if self._dead is not None:
            return f"the engine has stopped: {self._dead}"
        try:
            self.engine.check_health()  # tensor parallelism: a rank that died ends the engine
        except Exception as exc:  # noqa: BLE001 - its reason is the answer
            return f"the engine has stopped: {exc}"
        if not self._thread.is_alive():
            return "the engine thread is not running"
        return None

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting client
            logger.exception("the engine thread died")
            with self._door:
                self._dead = exc
        else:
            with self._door:
                self._dead = EngineDeadError("the server is shutting down")
        self._fail_streams(EngineDeadError(f"the engine has stopped: {self._dead}"))
        # Anything still in the queue: refuse adds, so no caller waits forever.
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                error = EngineDeadError(f"the engine has stopped: {self._dead}")
                self._call(command.loop, _resolve, command.accepted, error)
            elif isinstance(command, _Barrier):
                command.done.set()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            idle = not engine.has_unfinished_requests()
            must_step = False
            barriers = []
            self._sleeping = idle
            commands = self._take_commands(block=idle)
            self._beat = time.monotonic()  # (before `_sleeping` falls: never a stale beat)
            self._sleeping = False
            for command in commands:
                if isinstance(command, _Stop):
                    return
                if isinstance(command, _Barrier):
                    barriers.append(command.done)
                else:
                    must_step |= self._handle(command)
            if engine.has_unfinished_requests() or must_step:
                self._step()
            self._flush_events()
            self._publish_stats()
            for done in barriers:
                done.set()

    def _take_commands(self, block: bool) -> list[object]:
        commands = []
        if block:
            commands.append(self._commands.get())
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, command: object) -> bool:
        """Apply one command; True when the engine holds an output to drain with a step."""
        engine = self.engine
        if isinstance(command, _Add):
            try:
                request = engine.add_request(command.request_id, command.prompt, command.params)
            except Exception as exc:  # noqa: BLE001 - the caller decides what it means
                self._call(command.loop, _resolve, command.accepted, exc)
                return False
            # Keyed by the caller's id: with n > 1 the engine runs children under other ids, and
            # its outputs carry the caller's.
            self._streams[command.request_id] = (command.stream, command.loop)
            self._num_completions[command.request_id] = command.params.n
            self._timer.add(
                command.request_id,
                command.arrival,
                request.num_prompt_tokens,
                command.params.n,
                request.max_tokens,
            )
            # Per completion, as vLLM counts its n child requests.
            self._prompt_tokens += request.num_prompt_tokens * command.params.n
            so = request.structured_output_request
            if so is not None and so.grammar is None:
                # Its grammar compiles off this thread: the caller hears once it has (or a
                # ValueError naming why not), while the other requests step on.
                self._awaiting_grammar.append((command, request))
            else:
                self._call(command.loop, _resolve, command.accepted, None)
        elif isinstance(command, _Abort):
            self._has_output.discard(command.request_id)
            if self._streams.pop(command.request_id, None) is None:
                return False  # finished already, or never accepted
            self._timer.forget(command.request_id)
            try:
                engine.abort_request(command.request_id)
            except ValueError:
                return False
            self._finished["abort"] += self._num_completions.pop(command.request_id, 1)
            return True  # the abort output waits in the engine until the next step
        elif isinstance(command, _FailAll):
            if command.unstarted_only:
                return self._fail_unstarted(command.error)
            self._fail_streams(command.error)
        elif isinstance(command, _Subscribe):
            sink = _Sink(command.loop)
            # Right after `EngineStarted`: the state so far, so a late listener starts from it.
            sink.unsubscribe = engine.subscribe(sink.buffer.append, snapshot=True)
            self._sinks[command.sink] = sink
        elif isinstance(command, _Unsubscribe):
            sink = self._sinks.pop(command.sink, None)
            if sink is not None:
                sink.unsubscribe()
        return False

    def _step(self) -> None:
        step_start = time.monotonic()
        try:
            outputs = self.engine.step()
        except WorkerGroupError:
            self._num_errors += 1
            raise  # a rank died: no step can run again, so the thread stops (`_run`)
        except Exception as exc:  # noqa: BLE001 - fail the requests, keep serving
            logger.exception("engine step failed; aborting the requests in flight")
            self._num_errors += 1
            self._fail_streams(EngineError(f"engine step failed: {type(exc).__name__}: {exc}"))
            return
        step_end = self._beat = time.monotonic()
        self._num_steps += 1
        if self._awaiting_grammar:
            self._accept_compiled()
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        new_tokens = 0
        for output in outputs:
            new_tokens += sum(len(c.delta_token_ids) for c in output.outputs)  # (n > 1: all)
            entry = self._streams.get(output.request_id)
            if entry is None:
                continue  # aborted: nobody is listening
            stream, loop = entry
            by_loop.setdefault(loop, []).append((stream, output))
            self._has_output.add(output.request_id)
            if output.finished:
                del self._streams[output.request_id]
                self._has_output.discard(output.request_id)
                self._num_completions.pop(output.request_id, None)
                for completion in output.outputs:
                    self._finished[completion.finish_reason or "unknown"] += 1
        for loop, items in by_loop.items():
            self._call(loop, _deliver, items)
        self._count_tokens(new_tokens)
        stats = self._timer.step(step_start, step_end, self.engine.stats.live.running, outputs)
        if stats:
            for observe in self._stats_observers:
                try:
                    observe(stats)
                except Exception:  # noqa: BLE001 - a broken observer must not stop the engine
                    logger.exception("a stats observer failed")

    def _accept_compiled(self) -> None:
        """Answer the adds whose grammar the engine has now installed, or refused: a refused
        one's caller gets the engine's ValueError (its error output goes to nobody)."""
        waiting = []
        for command, request in self._awaiting_grammar:
            if request.structured_output_request.grammar is not None:
                self._call(command.loop, _resolve, command.accepted, None)
            elif request.is_finished:
                if self._streams.pop(command.request_id, None) is not None:
                    self._timer.forget(command.request_id)
                    self._num_completions.pop(command.request_id, None)
                    self._prompt_tokens -= request.num_prompt_tokens * command.params.n
                error = ValueError(request.error or "the request was aborted")
                self._call(command.loop, _resolve, command.accepted, error)
            else:
                waiting.append((command, request))
        self._awaiting_grammar = waiting

    def _fail_unstarted(self, error: BaseException) -> bool:
        """Abort each request that has had no output yet and hand its stream `error`; True when
        one was (its abort output waits for the next step, which the running ones need)."""
        failed = [rid for rid in self._streams if rid not in self._has_output]
        for command, _ in self._awaiting_grammar:
            if command.request_id in failed:
                self._call(command.loop, _resolve, command.accepted, None)
        self._awaiting_grammar = [
            a for a in self._awaiting_grammar if a[0].request_id not in failed
        ]
        for request_id in failed:
            stream, loop = self._streams.pop(request_id)
            self._timer.forget(request_id)
            try:
                self.engine.abort_request(request_id)
                self._finished["abort"] += self._num_completions.pop(request_id, 1)
            except ValueError:
                pass
            self._call(loop, _deliver, [(stream, error)])
        return bool(failed)

    def _fail_streams(self, error: BaseException) -> None:
        """Abort every request we serve (freeing its blocks) and hand each stream `error`."""
        for command, _ in self._awaiting_grammar:  # each stream below hears `error`
            self._call(command.loop, _resolve, command.accepted, None)
        self._awaiting_grammar = []
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, (stream, loop) in list(self._streams.items()):
            try:
                self.engine.abort_request(request_id)
                self._finished["abort"] += self._num_completions.pop(request_id, 1)
            except Exception:  # noqa: BLE001 - already gone, or the engine is broken
                pass
            by_loop.setdefault(loop, []).append((stream, error))
        self._streams.clear()
        self._num_completions.clear()
        self._has_output.clear()
        self._timer.clear()
        for loop, items in by_loop.items():
            self._call(loop, _deliver, items)
        try:
            self.engine.step()  # drain the abort outputs
        except Exception:  # noqa: BLE001
            pass

    def _call(self, loop: asyncio.AbstractEventLoop, fn, *args) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # that event loop is closed: its clients are gone
            for request_id, (_, other) in list(self._streams.items()):
                if other is loop:
                    self._handle(_Abort(request_id))
            for sink, state in list(self._sinks.items()):
                if state.loop is loop:
                    self._handle(_Unsubscribe(sink))

    def _flush_events(self) -> None:
        for sink, state in list(self._sinks.items()):
            if state.buffer:
                batch = state.buffer[:]
                state.buffer.clear()
                self._call(state.loop, sink._push, batch)

    def _count_tokens(self, n: int) -> None:
        self._generation_tokens += n
        second = int(time.time())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([second, n])
        while self._buckets and self._buckets[0][0] < second - RATE_WINDOW_S - 1:
            self._buckets.popleft()

    def _publish_stats(self) -> None:
        engine = self.engine
        live = engine.stats.live
        self.stats = ServerStats(
            model=self.model_name,
            num_running=live.num_running,
            num_waiting=live.num_waiting,
            num_kv_blocks=live.num_blocks,
            num_used_blocks=live.num_used_blocks,
            num_cached_free_blocks=live.num_cached_free_blocks,
            num_preemptions=engine.stats.num_preemptions,
            prefix_cache_queries=engine.stats.prefix_cache_queries,
            prefix_cache_hits=engine.stats.prefix_cache_hits,
            external_prefix_cache_hits=engine.stats.external_prefix_cache_hits,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_steps=self._num_steps,
            num_engine_errors=self._num_errors,
            finished=dict(self._finished),
            num_event_subscribers=len(self._sinks),
            token_buckets=tuple((s, n) for s, n in self._buckets),
            started_at=self._started_at,
            **self._spec_decode_stats(),
        )

    def _spec_decode_stats(self) -> dict:
        """The engine's speculative decoding counters (none when it does not speculate)."""
        started = self.engine.started_event
        if started.speculative_method is None:
            return {}
        spec = self.engine.stats.spec_decoding
        k = started.num_speculative_tokens
        per_pos = spec.num_accepted_tokens_per_pos
        return dict(
            num_speculative_tokens=k,
            spec_decode_num_drafts=spec.num_drafts,
            spec_decode_num_draft_tokens=spec.num_draft_tokens,
            spec_decode_num_accepted_tokens=spec.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(per_pos) + (0,) * (k - len(per_pos)),
        )
