"""The help screen: the keys, what each view shows, and the scenarios."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from nanovllm.viz.scenarios import SCENARIOS

KEYS = """\
# nanovllm viz

The engine runs in the background; every view is rebuilt from the events it emits.

| key | action |
|---|---|
| `space` | pause / resume |
| `s` | one whole step (pauses first if running) |
| `e` | one event of the step: watch it happen in the engine's order |
| `←` / `→` | back / forward one step through the recorded history; `end`: newest |
| `+` / `-` | faster / slower: 1 to 16 events/s (each event on screen as long as the next), then 16 and 32 steps/s, then as fast as possible |
| `↑` / `↓` | select the previous / next request (or click it) |
| `a` | add a request with your own prompt (not in a replay) |
| `1`-`9`, `0`, `c` | switch scenario (`0`: the tenth) / next scenario (live runs) |
| `x` | the executor panel (the step's flat batch) in place of the timeline and the step |
| `[` / `]` | the executor panel's flat batch: previous / next page of tokens |
| `h` | with the executor panel: the next attention head in the heat row |
| `l` | with the executor panel: the next layer the heat row probes (vLLM's `layers.N`, from 0), from the next step on |
| `?` | this help (`escape` closes it) |
| `q` | quit |

What the latest event changed is drawn in white.

## The views

- **Queues**: waiting, running, finished. A preempted request goes back to the *front* of
  the waiting queue (`⟲` counts its preemptions); `n=3` marks a child of parallel sampling.
- **Model executor** (`x`): the step's flat batch, one column a token: row and request, token
  text and id, position, slot `block·block_size+offset`, logits row (`✓` sampled); each request's query
  start `q@`, tokens, context `ctx` and block table (a chunk samples nothing); the selected
  request's attention reading its blocks one after the other, and under it what one head
  computed there (`h`: next head): each token's score q·k, the online softmax's running max
  and sum after each block, and the final weights as a heat row; the logits rows. The step
  plays stage by stage: inputs, K/V write (slots light up), attention, logits, sampled.
- **Why it waits** (queues): `⧗seqs` max_num_seqs already run, `⧗block` no free KV block,
  `⧗budget` the token budget is spent, `⧗preempt` a preemption this step, `⧗new` not yet
  considered; the paging view says it in words for a selected waiting request.
- **Batch timeline**: a row per request, a column per step. `P` prefill, `p` prefill chunk,
  `=` decode, `≡` decode + proposed tokens verified, `X` preempted, `·` waiting.
- **Step**: the step's tokens by request against the token budget, in proportion;
  upper-case letters are prompt tokens, lower-case ones decode tokens, `·` unused budget.
- **Block tables**: each running request's logical blocks → physical block ids (a request
  being admitted from its first block: `admitting`); `²` marks a block shared through the
  prefix cache; the gauge is how many slots of the last block hold K and V.
- **Paging**: the selected request's logical blocks as rows of token slots with the tokens'
  text, each labelled logical → physical block, with ref count, owners and fill; accepted
  proposals underlined, proposals being verified `?`.
- **KV cache**: every physical block, coloured by owner: `A` owned, `A²` shared, `a` free but
  still holding a cached prefix (`#`: a prefix cached before you connected), `·` free; the
  selected request's blocks underlined.
- **Free block queue**: head to tail, coloured by the cached prefix each block holds, `▾` the
  next eviction, `←n` taken at the head, `↑n` pulled out by a prefix hit.
- **KV connector** (with one): the host tier's slots, `■` holds a prefix, `·` empty, `+`
  saved this step, `⇡` loaded into a device block this step, `▾` dropped next when full; the
  step's traffic, e.g. `loaded t7→b12; saved b12→t11` (t: tier slot, b: device block).
- **Experts** (a mixture-of-experts model): a row per sparse layer, a column per expert, the
  tokens the router sent each this step (`·` none), `×` the busiest over the mean; with expert
  parallelism the columns grouped by the rank that holds them, and each rank's pairs.
- **What happened**: the step in words, in the engine's order.
- **Metrics**: throughput in engine time, KV usage, internal fragmentation (and `contig.`:
  the same requests with a contiguous `max_model_len` reservation each), prefix-cache hit
  rate, preemptions, and a step's time split into scheduling and forward pass; with
  speculative decoding the acceptance rate and tokens per draft.

## Scenarios
"""


def help_markdown() -> str:
    lines = [KEYS]
    for i, scenario in enumerate(SCENARIOS.values(), 1):
        lines.append(f"{i}. **{scenario.name}**: {scenario.title}. {scenario.what_to_watch}")
    return "\n".join(lines) + "\n"


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(help_markdown())
