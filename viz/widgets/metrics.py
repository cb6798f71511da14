"""Metrics, all from events: throughput, KV usage, fragmentation, prefix hits, preemptions, and
where a step's time goes (scheduling on the CPU vs the forward pass; with tensor parallelism,
each rank's forward pass).

With speculative decoding (from the first verification on) two more rows: the acceptance rate
(accepted proposed tokens / proposed tokens) and the mean accepted length (tokens a request
gains per verification: the accepted proposals plus the one token the step adds), the figures
the engine's `stats.spec_decoding` and vLLM report.

Beside the paged cache's internal fragmentation, `contig.` shows the same running requests in
a cache without paging, each reserving `max_model_len` contiguous slots when it is admitted (the
PagedAttention paper's baseline): how much of that reservation would be empty, and how many
such reservations the same memory holds.

Throughput is measured in *engine* time (schedule + forward of the recent steps), so it does
not change when you slow the animation down.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState, contiguous_figures, rank_forward_times
from nanovllm.viz.style import DIM, bar, fit, rank_times, seconds
from nanovllm.viz.widgets.base import StateView


class MetricsView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.last_step, state.metrics, bool(state.draft.events))

    def render(self) -> Table | Text:
        state, m = self.state, self.state.metrics
        summary = state.last_step.summary if state.last_step else None
        if summary is None:
            return Text("no steps yet", DIM)
        value_width = max(8, self.size.width - 11)
        gauge = max(4, min(12, value_width - 5))
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True, width=10)
        table.add_column(no_wrap=True, overflow="ellipsis", max_width=value_width)
        # The figures are the last *finished* step's: while the next one plays event by event,
        # say so, or they would seem to describe the step the top line shows.
        as_of = Text(f"end of step {summary.step}")
        playing = f", {summary.step + 1} playing"
        if state.draft.events and len(as_of) + len(playing) <= value_width:
            as_of.append(playing, DIM)
        table.add_row("as of", as_of)
        timed = any(s + f for _, s, f in m.recent)  # (`viz.screenshots` leaves timings out)
        table.add_row("tokens/s", f"{m.tokens_per_s:,.0f}" if timed else "—")
        total = summary.num_used_blocks + summary.num_free_blocks
        usage = summary.num_used_blocks / total if total else 0.0
        table.add_row("KV usage", bar(usage, gauge, "#e5c07b") + Text(f" {usage:.0%}"))
        allocated = summary.num_allocated_slots
        frag = 1 - summary.num_filled_slots / allocated if allocated else 0.0
        table.add_row("fragment.", Text(f"{frag:.1%} empty"))
        # The same requests without paging: a max_model_len reservation each.
        contiguous = contiguous_figures(state)
        if contiguous.num_requests:
            figures = Text(
                f"{contiguous.fragmentation:.0%} empty, "
                f"{min(contiguous.num_fit, contiguous.num_requests)}/{contiguous.num_requests}"
                " fit",
                DIM,
            )
            table.add_row("contig.", fit(figures, value_width))
        hits = m.prefix_hit_rate
        table.add_row("prefix hit", bar(hits, gauge, "#c678dd") + Text(f" {hits:.0%}"))
        table.add_row("preempted", f"{m.num_preemptions}")
        if m.num_drafts:
            rate = m.acceptance_rate
            table.add_row("spec acc.", bar(rate, gauge, "#98c379") + Text(f" {rate:.0%}"))
            table.add_row("spec len", f"{m.mean_accepted_length:.2f} tokens/draft")
        step_time = summary.schedule_time + summary.forward_time
        table.add_row("step time", seconds(step_time) if step_time else "—")
        table.add_row(" schedule", Text(seconds(summary.schedule_time) if step_time else "—", DIM))
        table.add_row(" forward", Text(seconds(summary.forward_time) if step_time else "—", DIM))
        ranks = rank_forward_times(state)
        if ranks:  # tensor parallelism: each rank's own forward pass, messages included
            table.add_row(f"  {len(ranks)} ranks", Text(rank_times(ranks), DIM))
        done = f"{m.num_finished} done"
        if m.num_rejected:
            done += f", {m.num_rejected} rejected"
        table.add_row("requests", done)
        return table
