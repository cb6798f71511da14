"""`nanovllm viz --animate OUT.svg`: an animated SVG made of real headless screenshots.

The app runs headless (Textual's `auto_pilot`), goes to step `--steps`, then presses `e` once
per frame: every frame is the screen after one more engine event, exported by Textual exactly
as `--screenshot` does. `animated_svg` stacks the frames in one SVG and shows them in turn with
a CSS animation (each Textual export names its classes and clip paths with its own prefix, so
the frames do not collide). Nothing is drawn by hand: the README's animation is made with

    nanovllm viz --scenario burst --animate viz/animation.svg --steps 34 --frames 15 --size 100x30
"""

from __future__ import annotations

import re
from pathlib import Path

from textual.pilot import Pilot

FRAME_SECONDS = 0.9  # each event on screen
LAST_FRAME_SECONDS = 2.5  # the end of the step, before the animation starts again

_CLIP_ATTR = re.compile(r' clip-path="url\(#[^)]*\)"')


def _parts(svg: str) -> tuple[str, str, str]:
    """(the opening `<svg ...>` tag, the frame's style rules, its drawing)."""
    open_end = svg.index(">", svg.index("<svg")) + 1
    style_start = svg.index("<style>") + len("<style>")
    style_end = svg.index("</style>")
    body = svg[style_end + len("</style>") : svg.rindex("</svg>")]
    # Per-line clip paths only cut text that overflows a line; a frame needs none of them.
    body = _CLIP_ATTR.sub("", body)
    body = re.sub(r"<clipPath.*?</clipPath>", "", body, flags=re.S)
    return svg[:open_end], svg[style_start:style_end], body


def animated_svg(frames: list[str], seconds: list[float]) -> str:
    """One SVG that shows `frames[i]` for `seconds[i]`, in a loop."""
    if not frames or len(frames) != len(seconds):
        raise ValueError("need one duration per frame, and at least one frame")
    total = sum(seconds)
    opening, first_style, _ = _parts(frames[0])
    styles, bodies, start = [first_style], [], 0.0
    for i, (frame, duration) in enumerate(zip(frames, seconds)):
        _, style, body = _parts(frame)
        if i:
            # Fonts and shared rules come once, from the first frame; keep the class rules.
            styles.append("\n".join(r for r in style.splitlines() if r.startswith(".terminal-")))
        begin, end = 100 * start / total, 100 * (start + duration) / total
        start += duration
        styles.append(
            f"@keyframes f{i} {{ 0% {{ opacity: 0 }} {begin:.3f}% {{ opacity: 1 }} "
            f"{end:.3f}% {{ opacity: 0 }} 100% {{ opacity: 0 }} }}\n"
            f".f{i} {{ opacity: {int(i == 0)}; animation: f{i} {total:.2f}s step-end infinite }}"
        )
        bodies.append(f'<g class="f{i}">{body}</g>')
    return opening + "<style>" + "\n".join(styles) + "</style>" + "".join(bodies) + "</svg>\n"


async def record_frames(pilot: Pilot, steps: int, count: int, timeout: float = 120.0) -> list[str]:
    """Wait for step `steps` (paused), then one exported frame per event, `count` in all; the
    last frame completes the step."""
    import asyncio
    import time

    app = pilot.app
    deadline = time.monotonic() + timeout

    async def until(predicate) -> None:
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the app did not get there in time")
            await pilot.pause(0.02)
        await pilot.pause()

    status = lambda: app.status  # noqa: E731 - read afresh each time
    await until(lambda: status() is not None and status().error is None and status().paused
                and app.state.step >= steps and app.is_settled())  # fmt: skip
    frames = [app.export_screenshot()]
    for n in range(1, count):
        seen, step = app.state.num_events, app.state.step
        if n == count - 1 and status().event:
            await pilot.press("s")  # the last frame: the rest of the step at once
            await until(lambda step=step: app.state.step > step or status().done)
        else:
            await pilot.press("e")
            await until(lambda seen=seen: app.state.num_events > seen or status().done)
        await asyncio.sleep(0)
        frames.append(app.export_screenshot())
    return frames


def write_animation(path: Path, frames: list[str]) -> Path:
    seconds = [FRAME_SECONDS] * (len(frames) - 1) + [LAST_FRAME_SECONDS]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(animated_svg(frames, seconds), encoding="utf-8")
    return path
