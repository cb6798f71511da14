"""Lesson 16 demo: a sliding window's blocks leave as it passes, and a hit needs one window.

1. One long request on the demo model read as Mistral (every layer a window of 32 tokens,
   blocks of 16), its block table every few steps from the engine's events: the blocks behind
   the window go back to the pool, the null block (·) in their place; then the same request on
   the demo model with full attention, which keeps every block.
2. A second request with the same long prompt, after the first is done: its prefix-cache hit
   is the last window's blocks, null before them, and still covers all but its last block.

Run it: `nanovllm lesson 16 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine, section, windowed_model_path

WINDOW, BLOCK = 32, 16
PROMPT = (
    "ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is "
    "the sun. Arise, fair sun, and kill the envious moon, who is already sick and pale with "
    "grief, that thou her maid art far more fair than she. JULIET: O Romeo, Romeo! wherefore art "
    "thou Romeo? Deny thy father and refuse thy name; or, if thou wilt not, be but sworn my love, "
    "and I'll no longer be a Capulet.\n"
)


class Tables:
    """Each request's block table, rebuilt from the engine's events: a block handed out goes at
    its index, a block given back while the request runs becomes the null block (·)."""

    def __init__(self) -> None:
        self.tables: dict[str, list[int | None]] = {}
        self.held: dict[str, int] = {}
        self.hits: dict[str, list[int]] = {}

    def __call__(self, event) -> None:
        from nanovllm.events import BlockAllocated, BlockFreed, CacheHit, RequestFinished

        rid = getattr(event, "request_id", None)
        if isinstance(event, CacheHit):
            self.hits.setdefault(rid, []).append(event.block_id)
        if isinstance(event, (BlockAllocated, CacheHit)):
            table = self.tables.setdefault(rid, [])
            table += [None] * (event.logical_index + 1 - len(table))
            table[event.logical_index] = event.block_id
            self.held[rid] = self.held.get(rid, 0) + 1
        elif isinstance(event, BlockFreed) and event.block_id in self.tables.get(rid, ()):
            table = self.tables[rid]
            table[table.index(event.block_id)] = None
            self.held[rid] -= 1
        elif isinstance(event, RequestFinished):
            self.tables.pop(rid, None)

    def shown(self, rid: str) -> str:
        return " ".join("·" if b is None else str(b) for b in self.tables.get(rid, []))


def _one_request(console: Console, windowed: bool) -> int:
    from nanovllm import SamplingParams

    model = windowed_model_path(WINDOW) if windowed else None
    options = dict(model=str(model)) if model else {}
    engine = make_engine(**options, block_size=BLOCK, max_model_len=512, num_kv_blocks=64)
    tables = Tables()
    engine.subscribe(tables)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    engine.add_request("r", PROMPT, params)
    table = Table(title="window of 32 tokens" if windowed else "full attention")
    for col in ("step", "tokens computed", "block table (· the null block)", "blocks held"):
        table.add_column(col)
    num_prompt = len(engine.tokenizer.encode(PROMPT))
    rows = []
    while engine.has_unfinished_requests():
        engine.step()
        if engine.has_unfinished_requests():  # (a finished request's table is gone)
            step = len(rows) + 1  # the prompt in step 1, then one token a step
            rows.append((step, num_prompt + step - 1, tables.shown("r"), tables.held["r"]))
    for row in rows:
        if row[0] in (1, 2) or row[0] % 20 == 0 or row is rows[-1]:
            table.add_row(*map(str, row))
    console.print(table)
    return rows[-1][3]


def run(console: Console) -> None:
    section(console, "1. The window passes: its blocks go back")
    last_window = _one_request(console, windowed=True)
    last_full = _one_request(console, windowed=False)
    console.print(
        f"The prefill takes a block per {BLOCK} prompt tokens either way (the prompt's own "
        f"queries read them all). From then on the window holds {last_window} blocks "
        f"(about {WINDOW} / {BLOCK} + 1, whatever the length), full attention {last_full} at the "
        f"end: one per {BLOCK} tokens of the request, and growing."
    )

    section(console, "2. A hit needs only the last window's blocks")
    from nanovllm import SamplingParams

    engine = make_engine(model=str(windowed_model_path(WINDOW)), block_size=BLOCK,
                         max_model_len=512, enable_prefix_caching=True)  # fmt: skip
    tables = Tables()
    engine.subscribe(tables)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for rid in ("first", "second"):
        engine.add_request(rid, PROMPT, params)
        out = engine.run_until_done()[rid]
    num_prompt = len(out.prompt_token_ids)
    console.print(
        f"The prompt has {num_prompt} tokens ({num_prompt // BLOCK} full blocks). The second "
        f"request's hit: {out.num_cached_tokens} tokens, yet only blocks "
        f"{tables.hits.get('second', [])} were found in the cache: the token after the hit sees "
        f"the {WINDOW - 1} before it, ceil({WINDOW - 1} / {BLOCK}) = "
        f"{-(-(WINDOW - 1) // BLOCK)} blocks; every block before them is the null block."
    )


if __name__ == "__main__":
    run(Console(highlight=False))
