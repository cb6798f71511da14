"""The selected request's text as it streams: its prompt (dim), then what the model wrote.

Tokens that were accepted proposals (speculative decoding) are underlined, when the events
gave the text of each token.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.state import VizState
from nanovllm.viz.style import DIM, request_label, text_style
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.words import count


class RequestTextView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        return (state.requests.get(self.selected) if self.selected else None,)

    def show(self, state: VizState, selected: str | None, status: DriverStatus | None) -> None:
        self.selected = selected  # `watched` reads it
        super().show(state, selected, status)

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        rid = self.selected
        info = self.state.requests.get(rid) if rid else None
        if info is None:
            return Text("select a request (↑/↓ or click one in the queues)", DIM)
        head = request_label(info, info.request_id)
        head.append(f" · {info.status}", DIM)
        if info.finish_reason:
            head.append(f" ({info.finish_reason})", DIM)
        head.append(f" · {info.num_output_tokens}/{count(info.max_tokens, 'token')}", DIM)
        if info.num_preemptions:
            head.append(f" · preempted {info.num_preemptions}×", "bold red")
        if info.grammar_allowed is not None:  # structured outputs: its last mask
            allowed = "/".join(map(str, info.grammar_allowed))
            head.append(f" · grammar allowed {allowed} of {count(info.vocab_size, 'token')}", DIM)
        body = Text()
        if info.prompt is not None:
            body.append(info.prompt, DIM)
        else:
            body.append(f"[{count(info.num_prompt_tokens, 'prompt token')}]", DIM)
        style = text_style(info.slot)
        if info.accepted and len(info.tokens) == info.num_tokens:
            accepted, marked = info.accepted_positions(), style + Style(underline=True)
            for t in range(info.num_prompt_tokens, info.num_tokens):
                body.append(info.tokens[t], marked if t in accepted else style)
        else:
            body.append(info.output_text, style)
        lines = list(body.wrap(self.app.console, max(1, width)))
        keep = max(0, height - 1)
        return Text("\n").join([head] + lines[-keep:] if keep else [head])
