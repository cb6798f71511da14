"""Make the small event trace the visualizer's tests replay: `tests/viz/data/trace.jsonl`.

Regenerate it (and then the app snapshots, see `test_viz_app.py`) with

    .venv/bin/python tests/viz/make_viz_trace.py

It runs the tiny random model of `tests/tiny_models.py` with a KV cache small enough, and a
workload planned so, that ~50 steps show every effect the visualizer draws: chunked prefill, a
shared prefix (blocks shared by two running requests, then cached-free blocks pulled back out of
the middle of the free queue), preemption, an abort, a rejected request and normal finishes;
speculative decoding (n-gram proposals accepted and rejected, and blocks that held only
rejected proposals freed while their request runs on); and a request with n = 3 (parallel
sampling: three children sharing the prompt's full blocks).
Greedy sampling makes the tokens deterministic; the step times are whatever this machine took.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACE = HERE / "data" / "trace.jsonl"

# Engine options of the trace: 20 blocks of 8 slots, 32 tokens per step, n-gram speculation.
SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
ENGINE = dict(
    block_size=8,
    num_kv_blocks=20,
    max_num_seqs=6,
    max_num_batched_tokens=32,
    seed=0,
    speculative_config=SPECULATIVE,
)

SHARED = (
    "CHORUS:\nTwo households, both alike in dignity,\nIn fair Verona, where we lay our scene,\n"
)

# tick -> [(request id, prompt, max_tokens, n)]; a prompt of None is an abort of that id.
PLAN: dict[int, list[tuple[str, str | None, int, int]]] = {
    0: [("r1", SHARED + "\nROMEO:\n", 12, 1), ("r2", SHARED + "\nJULIET:\n", 14, 1)],
    3: [("bad", "", 4, 1)],  # an empty prompt: rejected
    6: [
        ("r3", "HAMLET:\nTo be, or not to be, that is the question:", 28, 1),
        ("r4", "MACBETH:\nIs this a dagger which I see before me,", 28, 1),
        ("r5", "PORTIA:\nThe quality of mercy is not strain'd;", 28, 1),
    ],
    14: [("r4", None, 0, 1)],  # abort
    22: [("r6", SHARED + "\nNURSE:\n", 10, 1), ("r7", "JAQUES:\nAll the world's a stage,", 10, 1)],
    30: [("r8", "FESTE:\nhey, ho, hey, ho, hey, ho,", 12, 3)],  # three children
}


def record_trace(
    model_path: Path, max_steps: int = 80, check: Callable[[Any, list], None] | None = None
) -> list:
    """Run the planned workload on `model_path` and return its events.

    `check(engine, events_so_far)`, when given, runs after every step and every abort (the
    tests compare the reducer with the engine there).
    """
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(model_path), num_threads=1, **ENGINE))
    events: list = []
    engine.subscribe(events.append)
    tick = 0
    while tick < max_steps and (tick <= max(PLAN) or engine.has_unfinished_requests()):
        for request_id, prompt, max_tokens, n in PLAN.get(tick, []):
            if prompt is None:
                engine.abort_request(request_id)
                if check is not None:
                    check(engine, events)
                continue
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, n=n)
            try:
                engine.add_request(request_id, prompt, params)
            except ValueError:
                pass  # recorded as RequestRejected
        if engine.has_unfinished_requests():
            engine.step()
            if check is not None:
                check(engine, events)
        tick += 1
    return events


def main() -> int:
    sys.path.insert(0, str(HERE.parent))  # tests/, for tiny_models
    from tiny_models import make_model

    from nanovllm.viz.trace import write_trace

    with tempfile.TemporaryDirectory() as tmp:
        events = record_trace(make_model(Path(tmp) / "tiny"))
    TRACE.parent.mkdir(parents=True, exist_ok=True)
    write_trace(TRACE, events)
    print(f"wrote {len(events)} events to {TRACE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
