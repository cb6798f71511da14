"""Built-in scenarios: an engine configuration plus a workload, each made to show one effect.

Each scenario picks engine options that make its effect visible on the embedded model (vocab
~4k, context up to 1024) within a few dozen steps, and a workload that says which requests
arrive at each tick of the driver (one tick = one engine step, or one idle beat when there is
nothing to run). Workloads are seeded, so a scenario plays the same way every time.

    steady   requests arrive one every three steps or so: continuous batching refills the batch
    burst    a dozen long requests at once into a small KV cache: preemption
    prefix   every request starts with the same "system prompt": prefix caching, shared blocks
    chunked  prompts of several hundred tokens and a small token budget: chunked prefill
    speculative  greedy decoding with n-gram speculation: proposals accepted and rejected
    parallel     every request asks for several completions (n > 1): blocks with n owners
    offload      a tiny device pool over a host tier (OffloadingConnector): evicted prefixes
                 are saved to the tier, and copied back when a request returns to them
    disagg       two engines (`disagg.py`): a prefill engine computes each prompt and sends its
                 KV blocks to a decode engine over the P2pConnector's link
    hybrid       the embedded model with sliding-window layers (`hybrid_model.py`): two KV
                 cache groups, and a sliding group's blocks freed as the window passes
    moe          the embedded model as a mixture of experts (`moe_model.py`): how many tokens
                 the router sends each expert, step by step, and how unevenly
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nanovllm.viz import prompts
from nanovllm.viz.hybrid_model import hybrid_model_path
from nanovllm.viz.moe_model import moe_model_path


@dataclass(frozen=True)
class Arrival:
    """One request a workload sends."""

    prompt: str
    max_tokens: int
    seed: int
    n: int = 1  # completions (parallel sampling)
    temperature: float = 0.8


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    what_to_watch: str
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig overrides
    two_engines: bool = False  # a prefill and a decode engine (`disagg.py`), both with `engine`
    # Builds the folder of the model it runs (None: the embedded model), unless --model names one.
    model: Callable[[], Path] | None = None

    def workload(self, seed: int = 0) -> Workload:
        return Workload(self.name, seed)


MAX_WAITING = 4  # steady arrivals pause while this many requests wait


class Workload:
    """Arrivals per tick, from a seeded random generator (the same run every time)."""

    def __init__(self, kind: str, seed: int = 0) -> None:
        self.kind = kind
        self.rng = random.Random(seed)
        self.idle_ticks = 0

    def arrivals(self, tick: int, busy: bool, waiting: int = 0) -> list[Arrival]:
        """Requests that arrive at `tick`; `busy` tells whether the engine has work left,
        `waiting` how many requests wait for a place in the batch.

        Past the first tick, the scenarios of steady arrivals send nothing while
        `MAX_WAITING` requests wait: the engine can fall behind its arrivals (the prefix
        scenario's requests are long), and an unbounded queue would put a request typed with
        `a` behind all of them. The random draws are made either way, so a run's requests
        stay the same ones.
        """
        self.idle_ticks = 0 if busy else self.idle_ticks + 1
        out = self._arrivals(tick)
        if self.kind != "burst" and tick > 0 and waiting >= MAX_WAITING:
            return []
        return out

    def _arrivals(self, tick: int) -> list[Arrival]:
        rng = self.rng
        if self.kind == "steady":
            # About as many arrivals as finishes (8 slots, ~26 steps per request), so the queue
            # stays short and finishes are refilled from it at once.
            n = 4 if tick == 0 else int(rng.random() < 0.3)
            return [self._opening(rng.randint(12, 40)) for _ in range(n)]
        if self.kind == "burst":
            # A burst, then nothing until the engine has drained and rested a few ticks.
            if tick == 0 or self.idle_ticks >= 4:
                self.idle_ticks = 0
                return [self._opening(rng.randint(48, 96)) for _ in range(12)]
            return []
        if self.kind == "prefix":
            n = 3 if tick == 0 else int(rng.random() < 0.22)
            out = []
            for _ in range(n):
                system = prompts.SYSTEM_PROMPT if rng.random() < 0.8 else prompts.SYSTEM_PROMPT_2
                question = rng.choice(prompts.QUESTIONS)
                out.append(self._arrival(system + question, rng.randint(24, 56)))
            return out
        if self.kind == "chunked":
            n = 2 if tick == 0 else int(rng.random() < 0.12)
            out = []
            for _ in range(n):
                # Two speeches under a heading of their own: a first block no other prompt
                # shares, so the prefix cache cannot skip the prefill we want to see chunked.
                start = rng.randrange(len(prompts.SPEECHES))
                text = f"ACT {rng.randint(1, 5)}, SCENE {rng.randint(1, 99)}.\n\n" + "\n".join(
                    prompts.SPEECHES[(start + i) % len(prompts.SPEECHES)] for i in range(2)
                )
                out.append(self._arrival(text, rng.randint(16, 40)))
            return out
        if self.kind == "speculative":
            # Greedy: the embedded model's greedy text repeats itself ("[Enter PROVOST.]" again
            # and again), so its own earlier tokens predict the next ones well. Measured over
            # eight openings: about half the proposed tokens accepted, 3 tokens per draft.
            n = 3 if tick == 0 else int(rng.random() < 0.15)
            return [replace(self._opening(rng.randint(48, 96)), temperature=0.0) for _ in range(n)]
        if self.kind == "parallel":
            n = 2 if tick == 0 else int(rng.random() < 0.12)
            return [
                replace(self._opening(rng.randint(16, 40)), n=rng.randint(2, 4)) for _ in range(n)
            ]
        if self.kind == "offload":
            # Requests keep coming back to a few passages, but the device pool holds only two
            # requests' blocks: a passage's cached blocks are evicted in between, so its next
            # request finds them in the host tier.
            n = 2 if tick == 0 else int(rng.random() < 0.3)
            out = []
            for _ in range(n):
                passage = rng.choice(PASSAGES)
                out.append(
                    self._arrival(passage + rng.choice(prompts.QUESTIONS), rng.randint(16, 32))
                )
            return out
        if self.kind == "disagg":
            # Short openings (a few blocks to send each) and longer decodes: new prompts are
            # prefilled on one engine while earlier ones decode on the other.
            n = 2 if tick == 0 else int(rng.random() < 0.2)
            return [self._opening(rng.randint(12, 32)) for _ in range(n)]
        if self.kind == "hybrid":
            # Passages of 50-90 tokens and long decodes: every request outgrows the 32-token
            # window, so its sliding group frees a block every 8 tokens while it runs.
            n = 2 if tick == 0 else int(rng.random() < 0.15)
            out = []
            for _ in range(n):
                out.append(self._arrival(rng.choice(PASSAGES), rng.randint(40, 72)))
            return out
        if self.kind == "moe":
            # Steady openings, some with long prompts: a prefill routes many tokens at once
            # beside the decodes' one each, so a step's load swings from a few to dozens.
            n = 3 if tick == 0 else int(rng.random() < 0.3)
            out = []
            for _ in range(n):
                prompt = (
                    rng.choice(PASSAGES) if rng.random() < 0.4 else rng.choice(prompts.OPENINGS)
                )
                out.append(self._arrival(prompt, rng.randint(16, 40)))
            return out
        raise ValueError(f"unknown workload {self.kind!r}")

    def _opening(self, max_tokens: int) -> Arrival:
        return self._arrival(self.rng.choice(prompts.OPENINGS), max_tokens)

    def _arrival(self, prompt: str, max_tokens: int) -> Arrival:
        return Arrival(prompt, max_tokens, self.rng.randrange(2**31))


# The speculative scenario's proposer: vLLM's n-gram proposer, 4 tokens, matches of 2-5 tokens.
SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}

# The offload scenario's passages: the first lines of each speech (a few blocks each).
PASSAGES = tuple("".join(speech.splitlines(keepends=True)[:4]) for speech in prompts.SPEECHES)

# The offload scenario's connector: a host tier of 16 blocks under a device pool of 18.
OFFLOAD = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"num_cpu_blocks": 16},
}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "steady",
            "steady arrivals",
            "Requests arrive one every three steps or so. Watch the timeline: as soon as one "
            "finishes, a waiting one joins the very next step (continuous batching), and "
            "prefills share steps with decodes.",
            dict(block_size=16, num_kv_blocks=48, max_num_seqs=8, max_num_batched_tokens=256),
        ),
        Scenario(
            "burst",
            "burst: preemption",
            "Twelve long requests at once into 32 blocks. They all fit at first; as they "
            "grow, the cache runs out and the newest running request is preempted: its blocks "
            "go back to the free queue and it returns to the front of the waiting queue.",
            dict(block_size=16, num_kv_blocks=32, max_num_seqs=16, max_num_batched_tokens=512),
        ),
        Scenario(
            "prefix",
            "shared system prompt: prefix caching",
            "Every request starts with one of two system prompts. Its full blocks are computed "
            "once: running requests share them (ref count > 1), and after they finish the "
            "blocks wait, cached, in the free queue until a new request pulls them out of "
            "the middle.",
            dict(block_size=16, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256),
        ),
        Scenario(
            "chunked",
            "long prompts: chunked prefill",
            "Prompts of several hundred tokens and a token budget of 64 per step: a prompt is "
            "prefilled a chunk at a time over several steps, while the running requests keep "
            "decoding in the same steps.",
            dict(block_size=16, num_kv_blocks=128, max_num_seqs=4, max_num_batched_tokens=64),
        ),
        Scenario(
            "speculative",
            "repetitive text: speculative decoding",
            "Greedy decoding with n-gram speculation: each step proposes up to 4 tokens per "
            "request, copied from where its last tokens occurred before, and verifies them in "
            "the same forward pass (≡ in the timeline). Accepted proposals are underlined in "
            "the request's text; a block that held only rejected proposals goes straight back "
            "to the free queue while its request keeps running. Metrics: acceptance rate.",
            dict(
                block_size=8,
                num_kv_blocks=64,
                max_num_seqs=4,
                max_num_batched_tokens=128,
                speculative_config=SPECULATIVE,
            ),
        ),
        Scenario(
            "parallel",
            "n completions per prompt: parallel sampling",
            "Each request asks for 2-4 completions (SamplingParams(n=k)) and becomes k children "
            "0_r1, 1_r1, ...: the first computes the prompt, the others find its full blocks in "
            "the prefix cache, so those blocks have k owners (A³ in the grid), and each child "
            "owns only its own last block and output.",
            dict(block_size=8, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256),
        ),
        Scenario(
            "offload",
            "a host tier under the device pool: KV offloading",
            "Requests keep coming back to five passages, but the device pool (18 blocks) holds "
            "little more than two requests. A cached block the pool hands out again is first "
            "saved into the host tier (OffloadingConnector, 16 slots); a request that returns "
            "to its passage gets those blocks copied back instead of computing them. The tier "
            "panel beside the free queue shows its slots and each step's saves and loads; a "
            "full tier drops its least recently used block.",
            dict(
                block_size=8,
                num_kv_blocks=18,
                max_num_seqs=2,
                max_num_batched_tokens=256,
                kv_transfer_config=OFFLOAD,
            ),
        ),
        Scenario(
            "disagg",
            "two engines: disaggregated prefill and decode",
            "Two engines side by side. Each request runs first on the prefill engine (the "
            "producer: max_tokens=1), which sends its prompt's full KV blocks over the "
            "P2pConnector's link; then on the decode engine (the consumer), which copies "
            "those blocks into its own instead of computing them, and decodes. The link "
            "between them lists the latest blocks crossing (prefill block ──> hash ──> decode "
            "block) and counts them sent, received, loaded and failed.",
            dict(block_size=8, num_kv_blocks=40, max_num_seqs=6, max_num_batched_tokens=256),
            two_engines=True,
        ),
        Scenario(
            "hybrid",
            "sliding-window layers: a block table per KV cache group",
            "The embedded model with its last two layers given a 32-token window: two KV cache "
            "groups, each request a block table in each (full: every block it wrote; sliding: "
            "only the window's). As a request grows past the window, its sliding table's "
            "oldest blocks go back to the free queue and the null block (∅) takes their place; "
            "its full table keeps them all.",
            dict(block_size=8, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=256),
            model=hybrid_model_path,
        ),
        Scenario(
            "moe",
            "a mixture of experts: where the router sends the tokens",
            "The embedded model as a Mixtral: each layer's MLP is 8 experts, and a router sends "
            "every token to 2 of them. The experts panel counts, each step, the tokens each "
            "expert received in each layer: a prefill's many tokens spread unevenly, some "
            "experts get several times the mean (×) and some none. With "
            "--tensor-parallel-size 2 --enable-expert-parallel each rank holds 4 experts "
            "whole, and the panel counts the pairs each rank computed.",
            dict(block_size=16, num_kv_blocks=64, max_num_seqs=6, max_num_batched_tokens=256),
            model=moe_model_path,
        ),
    )
}

DEFAULT_SCENARIO = "steady"
