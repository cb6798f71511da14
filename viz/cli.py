"""`nanovllm viz`: the command line of the visualizer.

    nanovllm viz                                  the embedded model on the steady workload
    nanovllm viz --scenario burst                 preemption (also: prefix, chunked,
                                                  speculative, parallel, offload, disagg,
                                                  hybrid, moe)
    nanovllm viz --kv-transfer-config JSON        a KV connector: its tier beside the free queue
    nanovllm viz --record run.jsonl               ... and write every event to a trace
    nanovllm viz --replay run.jsonl               play a trace back, no model needed
    nanovllm viz --connect http://127.0.0.1:8000  watch a running `nanovllm serve`
    nanovllm viz --screenshot out.svg --steps 40  headless: run 40 steps, save the screen
    nanovllm viz --animate out.svg --steps 6      headless: step 7 event by event, animated
    nanovllm viz --measure 10                     headless: frames/s and engine steps/s
    nanovllm viz --web                            in a browser: prints a URL holding a key

Engine options (`--num-kv-blocks`, `--max-num-batched-tokens`, ...) override the scenario's.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from nanovllm.engine.generate_cli import add_engine_arguments, engine_options
from nanovllm.viz.driver import ANIMATE_UP_TO, DEFAULT_SPEED, EVENTS_PER_PACE
from nanovllm.viz.scenarios import DEFAULT_SCENARIO, SCENARIOS

# Engine options a scenario chooses unless the user gives them.
SCENARIO_OPTIONS = ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("visualizer")
    g.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default=DEFAULT_SCENARIO,
        help="built-in workload and engine options (default: %(default)s)",
    )
    g.add_argument("--replay", type=Path, metavar="TRACE", help="play back a recorded trace")
    g.add_argument("--record", type=Path, metavar="TRACE", help="write the events to a trace")
    g.add_argument(
        "--connect",
        metavar="URL",
        help="animate a running `nanovllm serve` at URL from its /v1/events stream (no model)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("NANOVLLM_API_KEY"),
        help="with --connect: the server's API key (default $NANOVLLM_API_KEY)",
    )
    g.add_argument(
        "--screenshot",
        type=Path,
        metavar="OUT",
        help="headless: run --steps steps, save the screen (.svg, .png, .txt) and exit",
    )
    g.add_argument(
        "--animate",
        type=Path,
        metavar="OUT",
        help="headless: run --steps steps, then write an animated SVG of the next --frames events",
    )
    g.add_argument("--frames", type=int, default=14, help="frames of --animate (default 14)")
    g.add_argument(
        "--steps", type=int, default=None, help="pause after N steps (screenshot: default 40)"
    )
    g.add_argument("--size", default="160x48", help="terminal size when headless (WxH)")
    g.add_argument(
        "--speed",
        type=float,
        default=None,
        help=f"pace (default {DEFAULT_SPEED:g}): up to {ANIMATE_UP_TO:g}, a step plays event by "
        f"event at {EVENTS_PER_PACE:g}x SPEED events/s; above, SPEED steps/s; 0 = as fast as "
        "possible. With --measure: play at this pace (default: as fast as possible)",
    )
    g.add_argument("--paused", action="store_true", help="start paused (space resumes)")
    g.add_argument(
        "--panel",
        choices=["executor"],
        default=None,
        help="open with the executor panel (the step's flat batch) shown; x toggles it",
    )
    g.add_argument(
        "--select",
        metavar="REQUEST_ID",
        default=None,
        help="select this request as soon as it appears (as clicking it would)",
    )
    g.add_argument(
        "--measure",
        type=float,
        metavar="SECONDS",
        help="headless: play for SECONDS (as fast as possible, or at --speed) and print UI "
        "frames/s, engine steps/s and the process's CPU use",
    )
    g.add_argument(
        "--web",
        action="store_true",
        help="serve the app to a browser (textual-serve, `pip install -e .[web]`): one app per "
        "tab, at a printed URL whose path holds a fresh key",
    )
    g.add_argument(
        "--host", default="127.0.0.1", help="with --web: the address to bind (default %(default)s)"
    )
    g.add_argument("--port", type=int, default=8000, help="with --web (default %(default)s)")
    g.add_argument("--workload-seed", type=int, default=0)
    add_engine_arguments(parser)
    # None = "the scenario decides"; an explicit value wins.
    parser.set_defaults(**{name: None for name in SCENARIO_OPTIONS})


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options the user actually chose (the rest come from the scenario)."""
    options = engine_options(args)
    out = {k: v for k, v in options.items() if v is not None}
    for flag in ("enable_prefix_caching", "enable_chunked_prefill"):
        if out.get(flag, True):
            out.pop(flag, None)  # only an explicit --no-... overrides
    for flag in ("disable_hybrid_kv_cache_manager", "enable_expert_parallel"):
        if not out.get(flag, False):
            out.pop(flag, None)  # only an explicit --disable-.../--enable-... overrides
    return out


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        size = int(w), int(h)
    except ValueError:
        raise ValueError(f"--size must look like 160x48, got {text!r}") from None
    if min(size) < 1:
        raise ValueError(f"--size must be positive, got {text!r}")
    return size


def _model_missing(model: str | None) -> str | None:
    from nanovllm.default_model import DEFAULT_MODEL_PATH

    path = Path(model) if model else DEFAULT_MODEL_PATH
    if not (path / "config.json").is_file():
        if model is None:
            return (
                f"the embedded model is not in {path} yet (no config.json): train it, or pass "
                "--model PATH, or play a trace with --replay TRACE"
            )
        return f"no checkpoint in {path} (no config.json)"
    return None


def run(args: argparse.Namespace) -> int:
    from nanovllm.viz.app import Measurement, VizApp
    from nanovllm.viz.driver import EngineDriver, ReplayDriver, pace_label

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    try:
        size = parse_size(args.size)
    except ValueError as exc:
        return fail(str(exc))
    if args.steps is not None and args.steps < 1:
        return fail(f"--steps must be >= 1, got {args.steps}")
    if args.speed is not None and args.speed < 0:
        return fail(f"--speed must be >= 0, got {args.speed}")
    goals = [g for g in (args.screenshot, args.measure, args.animate) if g is not None]
    headless = bool(goals)
    if len(goals) > 1:
        return fail("--screenshot, --animate and --measure do not go together")
    if args.frames < 1:
        return fail(f"--frames must be >= 1, got {args.frames}")
    if args.web:
        if headless:
            return fail("--web does not go with --screenshot, --animate or --measure")
        if args.record is not None:
            return fail("--web does not go with --record (every browser tab runs its own app)")
        if os.environ.get("NANOVLLM_VIZ_WEB_CHILD"):
            return fail("--web inside a --web session")
        if not 0 <= args.port <= 65535:
            return fail(f"--port must be 0-65535, got {args.port}")
        if sys.argv[1:2] != ["viz"]:
            return fail("--web runs from the command line only (`nanovllm viz --web`)")
    # Under --web each tab's app runs with Textual's web driver on a pipe, not a terminal.
    web_child = bool(os.environ.get("NANOVLLM_VIZ_WEB_CHILD"))
    if not headless and not args.web and not web_child and not sys.stdout.isatty():
        return fail("nanovllm viz needs an interactive terminal (or --screenshot / --measure)")

    steps = args.steps
    if (args.screenshot is not None or args.animate is not None) and steps is None:
        steps = 40
    if args.measure is not None and args.speed is not None:
        speed = args.speed  # measure a pace a person watches
    elif headless:
        speed = 0.0
    else:
        speed = DEFAULT_SPEED if args.speed is None else args.speed
    common = dict(paused=args.paused and not headless, speed=speed, max_steps=steps)
    if args.connect is not None:
        if args.replay is not None or args.record is not None:
            return fail("--connect does not go with --replay or --record")
        from nanovllm.viz.connect import ConnectDriver

        common["speed"] = 0.0  # the server sets the pace: show each step as it arrives
        connect = dict(common, api_key=args.api_key)
        make_driver = partial(_replay_driver, ConnectDriver, args.connect, connect)
    elif args.replay is not None:
        if args.record is not None:
            return fail("--record and --replay do not go together")
        if not args.replay.is_file():
            return fail(f"no trace at {args.replay}")
        make_driver = partial(_replay_driver, ReplayDriver, args.replay, common)
    else:
        missing = _model_missing(args.model)
        if missing:
            return fail(missing)
        try:
            overrides = engine_overrides(args)  # (a --kv-transfer-config that is not JSON)
        except ValueError as exc:
            return fail(str(exc))
        make_driver = partial(
            _engine_driver,
            EngineDriver,
            dict(
                scenario=args.scenario,
                overrides=overrides,
                record=args.record,
                workload_seed=args.workload_seed,
                **common,
            ),
        )
    if args.web:  # (the options are checked here, before any browser tab starts an app)
        try:
            import textual_serve  # noqa: F401  (an extra)

            from nanovllm.viz.web import serve_web
        except ImportError as exc:
            return fail(f"--web needs textual-serve: pip install -e '.[web]' ({exc})")
        return serve_web(sys.argv[2:], args.host, args.port)
    app = VizApp(
        make_driver,
        screenshot=args.screenshot,
        screenshot_steps=steps,
        measure=args.measure,
        panel=args.panel,
        select=args.select,
    )
    if args.animate is not None:
        result = app.run(headless=True, size=size, auto_pilot=partial(_animate, args, steps))
    else:
        result = app.run(headless=True, size=size) if headless else app.run()
    status = app.status
    if status is not None and status.error:
        print(f"error: {status.error}", file=sys.stderr)
        return 1
    if isinstance(result, Path):
        print(f"wrote {result} (step {app.state.step})")
    elif isinstance(result, Measurement):
        print(
            f"{result.seconds:.1f} s: {result.frames} frames = {result.fps:.1f} frames/s, "
            f"{result.steps} engine steps = {result.steps_per_s:.1f} steps/s, "
            f"CPU {result.cpu_share:.0%} of a core "
            f"({status.source if status else '?'}, {size[0]}x{size[1]}, "
            f"{pace_label(speed)})"
        )
    code = app.return_code or 0
    if not headless and getattr(args, "command", None) == "viz":
        # Run as `nanovllm viz` (not from a lesson, which goes on after it): the screen is
        # restored and nothing is left to write (the driver closed its trace, or was in the
        # middle of a step and lets it go). What remains is the interpreter's own teardown,
        # freeing torch and the model: measured at 1-2 s on a 2-core machine, in C, after
        # every atexit handler. The shell gets its prompt back at once instead.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


async def _animate(args: argparse.Namespace, steps: int, pilot) -> None:
    from nanovllm.viz.animation import record_frames, write_animation

    try:
        frames = await record_frames(pilot, steps, args.frames)
    except TimeoutError:
        pilot.app.exit(None)  # the status line says why (an engine error, say)
        return
    pilot.app.exit(write_animation(args.animate, frames))


def _replay_driver(cls, trace, common, publish, notify):
    return cls(trace, publish, notify=notify, **common)


def _engine_driver(cls, options, publish, notify):
    return cls(publish, notify=notify, **options)
