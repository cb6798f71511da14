"""The lessons' one way into the visualizer: replay a recorded run, paused at a step.

Everything the lessons know of `nanovllm.viz` is here, and it is only the public command line
(`nanovllm viz --replay TRACE --steps N`): the same arguments a user could type, parsed by the
visualizer's own parser. A trace is the engine's events as JSON lines (`nanovllm.events`),
which the lessons write themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def viz_argv(
    trace: Path,
    step: int,
    screenshot: Path | None = None,
    panel: str | None = None,
    select: str | None = None,
) -> list[str]:
    """`nanovllm viz` arguments that replay `trace` as fast as it goes and pause after `step`
    (with `screenshot`: headless, save the paused screen there instead; with `panel`, open on
    that panel; with `select`, that request selected)."""
    argv = ["--replay", str(trace), "--steps", str(step), "--speed", "0"]
    if panel is not None:
        argv += ["--panel", panel]
    if select is not None:
        argv += ["--select", select]
    if screenshot is not None:
        argv += ["--screenshot", str(screenshot)]
    return argv


def show(
    trace: Path,
    step: int,
    screenshot: Path | None = None,
    panel: str | None = None,
    select: str | None = None,
) -> int:
    """Open the visualizer on `trace`, paused after `step` (on `panel`, `select` selected); its
    exit status. On a terminal (no `screenshot`), the process ends when the visualizer does,
    as `nanovllm viz` does: the lesson has nothing left to do, and the interpreter's teardown
    (freeing torch and the engines the lesson ran) would keep the shell waiting seconds for its
    prompt."""
    from nanovllm.viz import cli

    parser = argparse.ArgumentParser(prog="nanovllm viz")
    cli.add_arguments(parser)
    code = int(cli.run(parser.parse_args(viz_argv(trace, step, screenshot, panel, select))) or 0)
    if screenshot is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
