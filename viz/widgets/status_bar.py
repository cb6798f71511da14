"""The top line: the step (and the event within it), history, the pace, with tensor parallelism
the ranks and each one's forward time in the last step, what is running."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from nanovllm.viz.driver import DriverStatus, pace_label
from nanovllm.viz.scenarios import SCENARIOS
from nanovllm.viz.state import VizState, rank_forward_times
from nanovllm.viz.style import ALERT, DIM, HEADING, fit, rank_times
from nanovllm.viz.widgets.base import StateView


class StatusBar(StateView):
    frames = 0  # renders so far, all instances: the frame counter of `--measure`

    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.engine, state.last_step, status)

    def render(self) -> Text:
        StatusBar.frames += 1
        state, status = self.state, self.status
        text = Text(no_wrap=True)
        text.append(" nanovllm viz ", "bold reverse")
        if status is None:
            return text
        text.append(f" step {state.step} ", HEADING)
        if status.event:
            total = f"/{status.num_step_events}" if status.num_step_events else ""
            text.append(f"▸ step {state.step + 1}, event {status.event}{total} ", "bold cyan")
        if status.behind:
            text.append(f" ◀ history: {status.behind} steps back (end: latest) ", "bold magenta")
        if status.error:
            text.append(f" error: {status.error} ", ALERT)
        elif status.loading:
            text.append(" loading… ", "bold yellow")
        elif status.done:
            text.append(" ■ end of trace ", "bold")
        elif status.paused:  # the pace too: `+`/`-` change it while paused
            text.append(" ⏸ paused ", "bold yellow")
            text.append(f"· {pace_label(status.speed)} ", "yellow")
        else:
            text.append(f" ▶ {pace_label(status.speed)} ", "bold green")
        if state.tensor_parallel_size > 1:  # tensor parallelism: the ranks of the last step
            times = rank_times(rank_forward_times(state))
            text.append(f"│ {state.tensor_parallel_size} ranks ", HEADING)
            if times:
                text.append(f"· forward {times} ", "bold cyan")
        if status.mode == "replay":
            text.append(f"│ replay {status.source} ({status.frame}/{status.num_frames}) ", HEADING)
        elif status.mode == "connect":
            text.append(f"│ server {status.source} ", HEADING)
        else:
            scenario = SCENARIOS.get(status.scenario or "")
            text.append(f"│ {scenario.title if scenario else status.scenario} ", HEADING)
            text.append(f"│ model {status.source} ", DIM)
        engine = state.engine
        if engine is not None:
            text.append(
                f"│ KV {engine.num_kv_blocks}×{engine.block_size} · budget "
                f"{engine.max_num_batched_tokens} tok/{engine.max_num_seqs} seqs ",
                DIM,
            )
        return fit(text, self.size.width)
