"""The paging diagram: how the selected request's tokens sit in the paged KV cache.

One row per logical block of the request, labelled `L2 → #24`: logical block 2 of the request
lives in physical block 24 (the KV grid underlines the request's blocks). Then the block's
reference count (and every owner, when the prefix cache shares it) and how many of its slots
hold a token. The slots show the tokens' text: bright where the token's K and V are already in
the cache, dim where the token is known but not computed yet (a prompt waiting for its next
chunk), `·` where the slot is still empty. A slot shows as much of its token as fits, escaped
(`␣` a space, `⏎` a newline, `\x07` an unprintable character), then a space, so tokens never
run together; the slots grow with the panel. Only the last block can have empty slots: that is
all the memory paged attention wastes (internal fragmentation).

Speculative decoding: while a step verifies proposed tokens their slots hold KV already but
the tokens are not the request's yet (`?` on yellow; the event only says how many); once
verified, the accepted ones become ordinary tokens, drawn underlined in green for as long as
the request lives, and the rejected slots are gone (a block that held only rejected slots went
back to the free queue). A child of parallel sampling names its parent and its siblings: the
prompt blocks they share show every sibling as an owner.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

from nanovllm.viz.driver import DriverStatus
from nanovllm.viz.executor import written_slots
from nanovllm.viz.state import (
    VizState,
    block_fill,
    family_of,
    latest_changes,
    primary_group,
    primary_table,
)
from nanovllm.viz.style import (
    DIM,
    FLASH,
    HEADING,
    PROPOSED,
    fit,
    request_label,
    superscript,
    token_cell,
)
from nanovllm.viz.waiting import why_waiting
from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.widgets.block_tables import NULL, group_tag
from nanovllm.viz.words import count

SLOT_BG = ("grey19", "grey30")  # alternate slot backgrounds, so token boundaries show
MIN_SLOT = 3  # characters a slot needs to show a little text (two, and a space)
MAX_SLOT = 13  # characters a slot takes at most (the last one always a space)


def slot_layout(block_size: int, width: int) -> tuple[int, int]:
    """(slots per line, characters per slot) for a block drawn in `width` characters.

    The slots per line divide the block evenly (a block wraps as 16, or 8 + 8, never 15 + 1),
    as many as fit at `MIN_SLOT` characters each; the slots then share the width, up to
    `MAX_SLOT` characters.
    """
    fits = [n for n in range(1, block_size + 1) if block_size % n == 0 and n * MIN_SLOT <= width]
    per_line = max(fits, default=1)
    return per_line, max(1, min(MAX_SLOT, width // per_line))


class PagingView(StateView):
    def watched(self, state: VizState, status: DriverStatus | None) -> tuple[Any, ...]:
        info = state.requests.get(self.selected) if self.selected else None
        return (info, state.blocks, state.draft)

    def show(self, state: VizState, selected: str | None, status: DriverStatus | None) -> None:
        self.selected = selected  # `watched` reads it
        super().show(state, selected, status)

    def render(self) -> Text:
        state = self.state
        width, height = self.size.width, self.size.height
        if width < 1 or height < 1:
            return Text()
        info = state.requests.get(self.selected) if self.selected else None
        if info is None:
            return Text("select a request (↑/↓, or click one in the queues)", DIM)
        bs = state.block_size
        table = primary_table(state, info)
        head = request_label(info, info.request_id)
        head.append(
            f" · {info.status} · {count(len(table), 'block')} · "
            f"{count(info.num_tokens, 'token')}, "
            f"{info.num_computed_tokens} in the cache",
            DIM,
        )
        groups = state.engine.kv_cache_groups if state.engine is not None else ()
        if len(groups) > 1:  # (the rows' blocks are one group's; the others' follow each row)
            head.append(f" · rows: the {group_tag(groups[primary_group(state)])} group", DIM)
        head = fit(head, width)
        heads = [head, *self._about_request(info, width)]
        if not table:
            why = {"waiting": "waiting: no blocks yet", "finished": "finished: blocks freed"}
            waits = why_waiting(state, info.request_id)  # the scheduler's reason
            if waits is not None:
                why["waiting"] = f"waiting, no blocks yet: {waits[1]}"
            return Text("\n").join([*heads, Text(why.get(info.status, "no blocks"), DIM)])
        label_width = len(f"L{len(table) - 1} → #{state.num_blocks - 1} ")
        avail = max(1, width - label_width)
        per_line, slot = slot_layout(bs, avail)
        lines_per_block = -(-bs // per_line)
        rows: list[list[Text]] = []
        for logical, block_id in enumerate(table):
            rows.append(self._block_rows(info, logical, block_id, label_width, per_line, slot))
        # Keep the newest blocks when they do not all fit: that is where the request grows.
        room = height - len(heads)
        out = heads
        if len(rows) * (lines_per_block + 1) > room:
            fits = max(1, room // (lines_per_block + 1))
            if fits < len(rows):
                out.append(Text(f"… {count(len(rows) - fits, 'earlier block')}", DIM))
                rows = rows[-max(1, fits - 1) :] if fits > 1 else rows[-1:]
        for block_rows in rows:
            out.extend(block_rows)
        out = [fit(line, width) for line in out]  # (a slot row always fits; a long note may not)
        return Text("\n").join(out[:height])

    def _about_request(self, info, width: int) -> list[Text]:
        """A line for its family (parallel sampling) and one for its proposals, when it has them."""
        lines = []
        family = family_of(self.state, info.request_id)
        if family is not None:
            parent, members = family
            siblings = " ".join(r for r in members if r != info.request_id)
            lines.append(Text(f"child of {parent} (n={len(members)}); siblings: {siblings}", DIM))
        if info.num_draft_tokens:
            rate = info.num_accepted_tokens / info.num_draft_tokens
            lines.append(
                Text(
                    f"speculation: {info.num_draft_tokens} proposed, "
                    f"{info.num_accepted_tokens} accepted ({rate:.0%}), underlined",
                    DIM,
                )
            )
        lines = [fit(line, width) for line in lines]
        return lines

    def _other_groups(self, info, logical: int) -> str:
        """Where logical block `logical` lives in each KV cache group but the one the row is
        labelled with (`primary_group`): ` · win32 #12`, or ` · win32 ∅` where that group's
        window passed it. Empty with one group."""
        state = self.state
        groups = state.engine.kv_cache_groups if state.engine is not None else ()
        shown = primary_group(state)
        parts = []
        for g, (group, table) in enumerate(zip(groups, info.block_tables)):
            if g != shown and logical < len(table):
                block_id = table[logical]
                where = NULL if block_id == state.null_block else f"#{block_id}"
                parts.append(f" · {group_tag(group)} {where}")
        return "".join(parts)

    def _block_rows(
        self, info, logical: int, block_id: int, label_width: int, per_line: int, slot: int
    ) -> list[Text]:
        state = self.state
        bs = state.block_size
        block = state.blocks[block_id] if block_id < state.num_blocks else None
        changed = block_id in latest_changes(state).blocks
        first = logical * bs
        filled = max(0, min(bs, info.num_tokens - first))
        computed = block_fill(state, info, logical)  # as the block tables count it
        accepted = info.accepted_positions() if info.accepted else frozenset()
        written = written_slots(state.draft.events)
        passed = block_id == state.null_block  # (a sliding group's block the window passed)
        label = Text(
            f"L{logical} → {NULL if passed else f'#{block_id}'}".ljust(label_width),
            FLASH if changed else HEADING,
        )
        about = Text(" " * label_width)
        refs = block.ref_count if block else 1
        about.append("the window passed it: no K/V kept" if passed else f"ref {refs}", DIM)
        if block is not None and refs > 1:
            about.append(f"{superscript(refs)} shared: " + " ".join(block.owners), "bold")
            family = family_of(state, info.request_id)
            if family is not None and set(block.owners) <= set(family[1]):
                about.append(" (siblings)", DIM)
        if not passed:
            about.append(f" · {computed}/{bs} slots", DIM)
        if filled > computed:
            about.append(f" · +{filled - computed} not computed yet", DIM)
        if block is not None and block.cached and not passed:
            about.append(f" · cached #{block.block_hash}", DIM)
        about.append(self._other_groups(info, logical), DIM)
        slots: list[Text] = []
        line = label
        for i in range(bs):
            if i and i % per_line == 0:
                slots.append(line)
                line = Text(" " * label_width)
            t = first + i
            bg = SLOT_BG[i % 2]
            if t < info.num_tokens and t < len(info.tokens):
                # As much of the token as the slot holds, then a space: tokens never run together.
                text = token_cell(info.tokens[t], max(1, slot - 1)).ljust(slot)
            elif t < info.num_tokens:
                text = "▮".ljust(slot)
            elif i < computed:  # a proposed token's slot, this step: verified, or about to be
                text = ("✓" if t in accepted else "?").ljust(slot)
            else:
                text = "·".ljust(slot)
            if t >= info.num_tokens and i < computed:
                style = PROPOSED
            elif t in accepted:
                style = Style(color="#98c379", bgcolor=bg, bold=True, underline=True)
            elif i < computed:
                style = Style(color="white", bgcolor=bg, bold=True)
            elif i < filled:
                style = Style(color="grey50", bgcolor=bg)
            else:
                style = Style(color="grey35")
            if block_id * bs + i in written:  # the executor just wrote its K/V
                style = FLASH
            line.append(text, style)
        slots.append(line)
        return slots + [about]
