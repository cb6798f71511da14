"""`VizApp`: the Textual app of `nanovllm viz`.

The app owns no engine. A `Driver` (live engine or replayed trace, see `driver.py`) runs in a
Textual thread worker and publishes immutable `VizState`s; the app keeps only the newest one in
a one-slot mailbox and posts itself an `EngineUpdate` message when the slot was empty; it
draws the newest state at most `MAX_FPS` times a second. So however fast the engine steps, the
UI draws at its own pace and never blocks, and the worker never waits for the UI. Keys become
`Command`s on the driver's thread-safe queue.

The views are small widgets (`widgets/`), laid out by `app.tcss`. The `disagg` scenario publishes
a `DisaggState` (two engines, `disagg.py`): the app then shows a second layout, each engine's
queues, KV cache, block tables and story side by side, the link between them in the middle. Besides the interactive mode
the app has two headless uses: take a screenshot after N steps (`screenshot=`), and measure
frames and steps per second (`measure=`).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.timer import Timer
from textual.widgets import Footer, Static

from nanovllm.viz.attention_heat import next_layer
from nanovllm.viz.disagg import DisaggState
from nanovllm.viz.driver import (
    SPEEDS,
    AddRequest,
    Back,
    Driver,
    DriverStatus,
    Forward,
    Notify,
    ProbeAttention,
    Publish,
    SetSpeed,
    Step,
    StepEvent,
    SwitchScenario,
    TogglePause,
    ToLatest,
)
from nanovllm.viz.messages import EngineNotice, EngineUpdate
from nanovllm.viz.scenarios import SCENARIOS
from nanovllm.viz.screens import AddRequestScreen, HelpScreen
from nanovllm.viz.state import RUNNING, VizState
from nanovllm.viz.widgets import (
    BlockTablesView,
    ExecutorView,
    ExpertsView,
    FreeQueueView,
    KVCacheView,
    LinkView,
    MetricsView,
    NarrativeView,
    PagingView,
    QueuesView,
    RequestTextView,
    StateView,
    StatusBar,
    StepView,
    TierView,
    TimelineView,
)

MIN_WIDTH, MIN_HEIGHT = 60, 16  # below this, a message instead of the views
# Frames per second at most. A full frame costs Textual tens of milliseconds of CPU; drawing
# every step of a fast engine would take the CPU (and the GIL) from the engine itself.
MAX_FPS = 12
# Seconds `q` waits for the engine's thread to stop (see `run_driver`).
STOP_WAIT = 0.3
FULL_STOP_WAIT = 60.0  # ... or, when the driver must close (see `on_unmount`), at most this

DriverFactory = Callable[[Publish, Notify], Driver]


@dataclass(frozen=True)
class Measurement:
    seconds: float
    frames: int
    steps: int
    cpu_seconds: float = 0.0  # the whole process's, every thread's (`time.process_time`)

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time: 1.0 is one core busy all along."""
        return self.cpu_seconds / self.seconds if self.seconds else 0.0

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


class VizApp(App[object]):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere work too
    TITLE = "nanovllm viz"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-medium"), (150, "-wide"), (200, "-huge")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-mid"), (40, "-tall")]
    ENABLE_COMMAND_PALETTE = False  # its footer entry would push `?` and `q` off 80 columns

    # In the footer's order: quitting and help first, so a narrow footer never loses them.
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("space", "toggle_pause", "pause"),
        Binding("s", "step", "step"),
        Binding("e", "step_event", "event"),
        # Shown only with the executor panel: its flat batch, a page of columns at a time.
        Binding("left_square_bracket", "page_batch(-1)", "page", key_display="[ ]"),
        Binding("right_square_bracket", "page_batch(1)", "page", show=False),
        Binding("h", "next_head", "head"),  # the heat row's head (also only with the panel)
        Binding("l", "next_layer", "layer"),  # the layer the engine probes (the same)
        Binding("left", "back", "back", key_display="←"),
        Binding("right", "forward", "fwd", key_display="→"),
        Binding("end", "latest", "latest", show=False),
        Binding("plus,equals_sign", "faster", "faster", key_display="+"),
        Binding("minus", "slower", "slower", key_display="-"),
        Binding("up,k", "select(-1)", "select", show=False),
        Binding("down,j", "select(1)", "select", show=False),
        Binding("a", "add_request", "add"),
        Binding("c", "next_scenario", "scenario"),
        Binding("x", "toggle_executor", "executor"),
        *(  # `1`-`9`, then `0` for the tenth
            Binding(str(i % 10), f"scenario({i - 1})", name, show=False)
            for i, name in enumerate(SCENARIOS, 1)
        ),
    ]

    def __init__(
        self,
        make_driver: DriverFactory,
        *,
        screenshot: str | Path | None = None,
        screenshot_steps: int | None = None,
        measure: float | None = None,
        panel: str | None = None,
        select: str | None = None,
    ) -> None:
        super().__init__()
        self.show_executor = panel == "executor"  # the executor panel, in the timeline's place
        self.driver = make_driver(self._publish, self._notify)
        self.state = VizState()
        self.status: DriverStatus | None = None
        self.selected: str | None = None
        self.follow = True  # select the oldest running request until the user picks one
        # A request to select as soon as it appears (`--select`), as if the user had picked it.
        self._wanted = select
        self.screenshot = Path(screenshot) if screenshot else None
        self.screenshot_steps = screenshot_steps
        self.measure = measure
        self.measurement: Measurement | None = None
        self._latest: tuple[VizState, DriverStatus] | None = None
        self._posted = False
        self._frame_timer: Timer | None = None
        self._last_frame = 0.0
        self._views: list[StateView] = []
        self.pair: DisaggState | None = None  # the `disagg` scenario's engines (then `state` is
        self._engine_views: dict[str, list[StateView]] = {}  # the decode engine's)
        self._finishing = False
        self._measure_start: tuple[float, float, int, int] | None = None
        self.engine_thread: threading.Thread | None = None
        self.speed = self.driver.status.speed  # the pace; `+`/`-` change it (`_change_speed`)
        # The request the engine's probe follows, and its layer (`l` picks it).
        self._probe_target: tuple[str | None, int] = (None, 0)
        self.probe_layer = 0

    # --- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Some views appear twice, each copy where one layout puts it; app.tcss shows one.
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield QueuesView(id="queues")
                yield BlockTablesView(id="tables-left", classes="tables")  # (narrow only)
                yield MetricsView(id="metrics")
                yield NarrativeView(id="story-left", classes="story")
                yield RequestTextView(id="text")
            with Vertical(id="center"):
                yield ExecutorView(id="executor")  # shown by `x`, in the timeline's place
                yield TimelineView(id="timeline")
                yield StepView(id="step")
                yield ExpertsView(id="experts")  # shown only for a mixture of experts
                yield KVCacheView(id="kv")
                with Horizontal(id="free-row"):
                    yield FreeQueueView(id="free")
                    yield TierView(id="tier")  # shown only with a KV connector
                with Horizontal(id="pages"):
                    yield BlockTablesView(id="tables-center", classes="tables")
                    yield PagingView(id="paging-center", classes="paging")
            with Vertical(id="right"):
                yield BlockTablesView(id="tables-right", classes="tables")
                yield PagingView(id="paging-right", classes="paging")
                yield NarrativeView(id="story-right", classes="story")
        with Horizontal(id="disagg"):  # the `disagg` scenario's two engines
            for engine in ("prefill", "decode"):
                with Vertical(id=engine, classes="engine"):
                    yield QueuesView(classes="e-queues")
                    yield KVCacheView(classes="e-kv")
                    yield BlockTablesView(classes="e-tables")
                    yield NarrativeView(classes="e-story")
                if engine == "prefill":
                    yield LinkView(id="link")
        yield Static(id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        titles = {
            QueuesView: ("Queues", ""),
            MetricsView: ("Metrics", ""),
            TimelineView: (
                "Batch timeline",
                "P prefill · p chunk · = decode · ≡ + proposals · X preempted · · waiting",
            ),
            StepView: ("Step composition", "upper case: prompt tokens · lower case: decode"),
            KVCacheView: ("Physical KV cache", "A owned · A² shared · a or # cached-free · · free"),
            FreeQueueView: ("Free block queue", "head: next out · tail: last freed"),
            TierView: ("KV connector", ""),  # named by the view itself, once it knows
            BlockTablesView: ("Block tables", "logical → physical · last block fill"),
            PagingView: (
                "Paging: the selected request",
                "logical → physical block · underlined: accepted proposal",
            ),
            NarrativeView: ("What happened", "in the engine's order"),
            RequestTextView: ("Selected request", ""),
            ExecutorView: ("Model executor: the step's flat batch", "one column a token · x hides"),
            ExpertsView: ("Experts: tokens the router sent each", "×: busiest over the mean"),
        }
        self._views = list(self.query(StateView))
        for view in self._views:
            if type(view) in titles:
                view.set_titles(*titles[type(view)])
        for engine, label in (("prefill", "prefill (producer)"), ("decode", "decode (consumer)")):
            self.query_one(f"#{engine}").border_title = label
            self._engine_views[engine] = list(self.query(f"#{engine} StateView"))
        self.query_one(LinkView).set_titles("link: blocks crossing", "P2pConnector · newest first")
        self._views = [
            v
            for v in self._views
            if not isinstance(v, LinkView)
            and all(v not in vs for vs in self._engine_views.values())
        ]
        self._check_size(self.size.width, self.size.height)
        self.screen.set_class(self.show_executor, "-executor")
        self.run_driver()

    def on_resize(self, event: Resize) -> None:
        self._check_size(event.size.width, event.size.height)

    def _check_size(self, width: int, height: int) -> None:
        too_small = width < MIN_WIDTH or height < MIN_HEIGHT
        self.screen.set_class(too_small, "-too-small")
        if too_small:
            self.query_one("#too-small", Static).update(
                f"The terminal is {width}×{height}; nanovllm viz needs at least "
                f"{MIN_WIDTH}×{MIN_HEIGHT}.\nEnlarge the window, or press q to quit."
            )

    # --- the worker and its mailbox -------------------------------------------------------

    def run_driver(self) -> None:
        """Start the driver in its own daemon thread, not a Textual thread worker: Textual runs
        those on asyncio's default executor, which the app joins on exit, so `q` pressed while
        the model loads or a step runs waited seconds for it. The app waits for the driver at
        most `STOP_WAIT` seconds (`on_unmount`): its close (the engine's shutdown) runs when it
        is between moves, as it almost always is; a recording or a headless goal waits for
        it."""
        self.engine_thread = threading.Thread(
            target=self.driver.run, name="nanovllm-viz-engine", daemon=True
        )
        self.engine_thread.start()

    def _publish(self, state: VizState, status: DriverStatus) -> None:
        """Called in the worker thread: keep only the newest state, wake the UI once."""
        self._latest = (state, status)
        if not self._posted:
            self._posted = True
            self.post_message(EngineUpdate())

    def _notify(self, text: str, severity: str) -> None:
        self.post_message(EngineNotice(text, severity))

    def on_engine_update(self, message: EngineUpdate) -> None:
        self._posted = False  # before reading: a state published from now on posts again
        if self._frame_timer is not None:
            return  # a frame is already due; it will draw the newest state
        wait = self._last_frame + 1 / MAX_FPS - time.monotonic()
        if wait > 0:
            self._frame_timer = self.set_timer(wait, self._draw_latest)
        else:
            self._draw_latest()

    def _draw_latest(self) -> None:
        self._frame_timer = None
        if self._latest is None or not self.screen_stack:
            return  # (no screen: a frame timer that fired while the app was closing)
        self._last_frame = time.monotonic()
        state, self.status = self._latest
        # Two engines: the single-engine views (hidden) and the selection follow the decode one.
        pair = state if isinstance(state, DisaggState) else None
        if (pair is None) != (self.pair is None):
            self.refresh_bindings()  # `x` (one engine's executor panel) comes or goes
        self.pair = pair
        self.state = state.decode if isinstance(state, DisaggState) else state
        self.screen.set_class(self.pair is not None, "-disagg")
        self.screen.set_class(self.state.tier.connector is not None, "-tier")
        self.screen.set_class(self.state.experts.latest is not None, "-moe")
        self._follow_selection()
        self._redraw()
        self._check_goals()

    def on_engine_notice(self, message: EngineNotice) -> None:
        # Long enough to read (a scenario's "what to watch" is a few sentences): 5 s, or
        # about 15 characters a second.
        timeout = max(5.0, len(message.text) / 15)
        self.notify(message.text, severity=message.severity, timeout=timeout)  # type: ignore[arg-type]

    def _redraw(self) -> None:
        # Every view, hidden ones too: a layout that shows one later must find it up to date
        # (Textual does not render a hidden widget, so this costs little).
        for view in self._views:
            view.show(self.state, self.selected, self.status)
        if self.pair is not None:
            for view in self._engine_views["prefill"]:
                view.show(self.pair.prefill, self.selected, self.status)
            for view in self._engine_views["decode"]:
                view.show(self.pair.decode, self.selected, self.status)
            self.query_one(LinkView).show(self.pair, self.selected, self.status)  # type: ignore[arg-type]
        self._sync_probe()

    # --- selection ------------------------------------------------------------------------------

    def _selectable(self) -> list[str]:
        """Requests in the order the queue view lists them."""
        s = self.state
        return [*s.waiting, *s.running, *reversed(s.finished)]

    def _follow_selection(self) -> None:
        if self._wanted is not None and self._wanted in self.state.requests:
            self.selected, self.follow, self._wanted = self._wanted, False, None
        info = self.state.requests.get(self.selected) if self.selected else None
        if info is None or (self.follow and info.status != RUNNING):
            if self.state.running:
                self.selected = self.state.running[0]
            elif info is None:
                choices = self._selectable()
                self.selected = choices[0] if choices else None

    def select(self, request_id: str | None) -> None:
        self.selected = request_id
        self.follow = False
        self._redraw()

    def action_select(self, delta: int) -> None:
        choices = self._selectable()
        if not choices:
            return
        if self.selected in choices:
            i = (choices.index(self.selected) + delta) % len(choices)
        else:
            i = 0
        self.select(choices[i])

    def on_queues_view_selected(self, message: QueuesView.Selected) -> None:
        self.select(message.request_id)

    # --- controls -----------------------------------------------------------------------------

    def action_toggle_pause(self) -> None:
        self.driver.send(TogglePause())

    def action_step(self) -> None:
        self.driver.send(Step())

    def action_step_event(self) -> None:
        self.driver.send(StepEvent())

    def action_back(self) -> None:
        self.driver.send(Back())

    def action_forward(self) -> None:
        self.driver.send(Forward())

    def action_latest(self) -> None:
        self.driver.send(ToLatest())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide what the source cannot do: a replay has no model; only a live run has scenarios;
        two engines (`disagg`) have no executor panel (it shows one engine's step)."""
        mode = self.driver.mode
        if action == "toggle_executor":
            return self.pair is None
        if action == "add_request":
            return mode != "replay"
        if action in ("scenario", "next_scenario"):
            return mode == "live"
        if action in ("page_batch", "next_head", "next_layer"):
            return self.show_executor and self.pair is None
        return True

    def _change_speed(self, delta: int) -> None:
        # From the pace the keys last set, not the last frame's: a frame comes at most 12 times
        # a second, so two quick presses would both start from the same old pace.
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 3
        i = max(0, min(len(SPEEDS) - 1, i + delta))
        self.speed = SPEEDS[i]
        self.driver.send(SetSpeed(self.speed))

    def action_faster(self) -> None:
        self._change_speed(+1)

    def action_slower(self) -> None:
        self._change_speed(-1)

    def action_add_request(self) -> None:
        def send(prompt: str | None) -> None:
            if prompt:
                self.driver.send(AddRequest(prompt))

        self.push_screen(AddRequestScreen(), send)

    def action_scenario(self, index: int) -> None:
        names = list(SCENARIOS)
        if 0 <= index < len(names):
            self.follow = True
            self.driver.send(SwitchScenario(names[index]))

    def action_next_scenario(self) -> None:
        names = list(SCENARIOS)
        current = self.status.scenario if self.status else None
        i = names.index(current) + 1 if current in names else 0
        self.action_scenario(i % len(names))

    def action_toggle_executor(self) -> None:
        self.show_executor = not self.show_executor
        self.screen.set_class(self.show_executor, "-executor")
        self.refresh_bindings()  # `[ ]` shows in the footer with the panel only
        self._sync_probe()

    def _sync_probe(self) -> None:
        """While the executor panel is open, the engine's attention probe follows the selected
        request (the panel's heat row, `widgets/attention_heat.py`); closed, the probe is off
        and the forward pass runs untouched. Told to the driver only when it changes."""
        want = self.selected if self.show_executor and self.pair is None else None
        layer = self.probe_layer if want is not None else 0
        if (want, layer) != self._probe_target:
            self._probe_target = (want, layer)
            self.driver.send(ProbeAttention(want, layer))

    def action_next_layer(self) -> None:
        """The heat row's layer: the next one, from the next step on (`next_layer`)."""
        executor = self.state.executor
        self.probe_layer = next_layer(self.probe_layer, executor.num_layers if executor else 0)
        self._sync_probe()

    def action_next_head(self) -> None:
        view = self.query_one(ExecutorView)
        view.attention_head += 1
        view.refresh()

    def action_page_batch(self, delta: int) -> None:
        self.query_one(ExecutorView).page(delta)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # --- headless goals: screenshot, measurement ---------------------------------------------

    def _check_goals(self) -> None:
        status = self.status
        if status is None or self._finishing:
            return
        if self.screenshot is not None:
            limit = self.screenshot_steps
            reached = limit is not None and self.state.step >= limit
            if reached or status.done or status.error:
                self._finishing = True
                self.call_after_refresh(self._save_and_exit)
        if self.measure is not None and not status.loading:
            if self._measure_start is None:
                self._measure_start = (
                    time.perf_counter(),
                    time.process_time(),
                    StatusBar.frames,
                    status.steps,
                )
                self.set_timer(self.measure, self._finish_measure)

    def is_settled(self) -> bool:
        """Whether the screen is complete: the footer fills itself in a little after mounting."""
        return bool(self.query_one(Footer).children)

    def _save_and_exit(self, tries: int = 100) -> None:
        assert self.screenshot is not None
        if not self.is_settled() and tries > 0:
            self.set_timer(0.02, lambda: self._save_and_exit(tries - 1))
            return
        self.call_after_refresh(self._shoot)  # once more: the footer's keys must be drawn too

    def _shoot(self) -> None:
        assert self.screenshot is not None
        self.exit(save_screenshot(self, self.screenshot))

    def _finish_measure(self) -> None:
        assert self._measure_start is not None
        start, cpu, frames, steps = self._measure_start
        steps_now = self.status.steps if self.status else steps
        self.measurement = Measurement(
            time.perf_counter() - start,
            StatusBar.frames - frames,
            steps_now - steps,
            time.process_time() - cpu,
        )
        self.exit(self.measurement)

    def exit(self, *args, **kwargs) -> None:  # type: ignore[override]
        self.driver.stop()  # the worker thread must end for the app to exit
        super().exit(*args, **kwargs)

    def on_unmount(self) -> None:
        self.driver.stop()
        if self.engine_thread is not None:
            # A headless goal (a screenshot, a measurement) or a trace being recorded waits for
            # the driver's close, so the trace ends whole; otherwise `q` waits `STOP_WAIT`.
            whole = (
                self.screenshot is not None
                or self.measure is not None
                or getattr(self.driver, "recorder", None) is not None
            )
            self.engine_thread.join(FULL_STOP_WAIT if whole else STOP_WAIT)


# --- screenshots --------------------------------------------------------------------------------


def screen_text(app: App) -> str:
    """The screen as plain text: what a snapshot test compares, readable in a diff."""
    from io import StringIO

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width, height=height, file=StringIO(), record=True, color_system=None,
        force_terminal=True, legacy_windows=False, safe_box=False,
    )  # fmt: skip
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    console.print(update)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def svg_to_png(svg: Path, png: Path) -> bool:
    """Convert with cairosvg or rsvg-convert, whichever is installed. False when neither is."""
    try:
        import cairosvg  # type: ignore[import-not-found]
    except ImportError:
        cairosvg = None
    if cairosvg is not None:
        cairosvg.svg2png(url=str(svg), write_to=str(png))
        return True
    rsvg = shutil.which("rsvg-convert")
    if rsvg:
        subprocess.run([rsvg, "-o", str(png), str(svg)], check=True)
        return True
    return False


def save_screenshot(app: App, path: Path) -> Path:
    """Write the screen to `path`: `.svg`, `.txt`, or `.png` (an SVG beside it, then converted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".txt":
        path.write_text(screen_text(app), encoding="utf-8")
        return path
    svg = path if path.suffix != ".png" else path.with_suffix(".svg")
    svg.write_text(app.export_screenshot(), encoding="utf-8")
    if path.suffix == ".png":
        if not svg_to_png(svg, path):
            app.notify("no SVG converter (cairosvg, rsvg-convert): wrote the SVG only")
            return svg
    return path
