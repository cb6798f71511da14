"""Hugging Face transformers three ways: static batches, one request at a time, and its own
continuous batching. The same checkpoint in fp32, with EOS disabled in both
`model.generation_config` and `model.config` (with either set, `generate` stops a sequence at
EOS even when asked for more).

**hf-static** (`generate` on left-padded batches, what most people write first): requests are
cut into batches of `batch_size` in workload order; each batch is padded to its longest prompt
and generated for as many tokens as its longest request asks for, so shorter requests keep
computing past what they wanted (only the tokens each asked for are counted). The suite tries
several batch sizes on shortened outputs and keeps the fastest. Online, it is a simple dynamic
batcher: whenever the model is idle, the requests that have arrived (up to `batch_size`) form
the next batch. Token times come from a streamer: `generate` calls `put()` once with the prompt,
then once per decoding step with the whole batch's new tokens.

**one-at-a-time** is hf-static with batches of one: the plain for-loop over prompts.

**hf-cb** (`init_continuous_batching`, transformers 5.x): a background thread schedules requests
into token-budgeted batches over a paged KV cache, much as nanovllm does. Left alone it sizes
its cache from GPU memory; the plug-in passes nanovllm's sizes instead (same KV blocks, page
size, token budget and request cap). A fresh manager is started for every run, before the
clock starts, so no run finds the previous run's prompts cached. Each request asks for its own
`max_new_tokens`, with `eos_token_id=-1` (never matches) and `record_timestamps=True`, which
stamps every token with `time.perf_counter()` in the generation thread.
"""

from __future__ import annotations

import logging
import time

import torch

from nanovllm.bench.engines import Engine, TokenCallback
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.steploop import drive
from nanovllm.bench.workload import Workload


def _sampling(workload: Workload) -> dict:
    if workload.greedy:
        return {"do_sample": False}
    return dict(do_sample=True, temperature=workload.temperature, top_k=0)


class _HFEngine(Engine):
    def load(self) -> dict:
        from transformers import AutoModelForCausalLM

        from nanovllm.bench.models import hf_source

        model = AutoModelForCausalLM.from_pretrained(
            **hf_source(self.model_path), dtype=torch.float32
        )
        model.eval()
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = None
        pad = model.config.pad_token_id
        model.generation_config.pad_token_id = 0 if pad is None else pad
        self.model = model
        return {"attn_implementation": model.config._attn_implementation}

    def close(self) -> None:
        self.model = None

    def _records(self, workload: Workload, tokens, stamps: dict, start: float) -> list:
        """Each request's tokens, with the times transformers stamped them (not when `drive`
        got them), as many as it asked for."""
        return [
            RequestRecord(
                tokens[i][: r.max_tokens],
                [t - start for t in stamps[i]][: r.max_tokens],
                r.arrival_s,
            )
            for i, r in enumerate(workload.requests)
        ]


class _StepTimes:
    """A `generate` streamer that stamps each decoding step: `put()` is called once with the
    prompt, then once per step with the whole batch's new tokens."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


class HFStaticEngine(_HFEngine):
    name = "hf-static"

    @property
    def batch_size(self) -> int:
        return self.limits.hf_batch_size

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        requests = workload.requests
        pad = self.model.generation_config.pad_token_id
        waiting: list[int] = []  # arrived, not yet in a batch
        stamps: dict[int, list[float]] = {}

        def generate_batch() -> list[tuple[int, list[int]]]:
            batch, waiting[:] = waiting[: self.batch_size], waiting[self.batch_size :]
            width = max(requests[i].num_prompt_tokens for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [batch, longest]
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding: every prompt ends at `width`
                ids[row, width - requests[i].num_prompt_tokens :] = torch.tensor(
                    requests[i].prompt_token_ids
                )
                mask[row, width - requests[i].num_prompt_tokens :] = 1
            if not workload.greedy:
                torch.manual_seed(requests[batch[0]].seed)
            streamer = _StepTimes()
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max(requests[i].max_tokens for i in batch),  # EOS is off
                    pad_token_id=pad,
                    streamer=streamer,
                    **_sampling(workload),
                )
            for i in batch:
                stamps[i] = streamer.times
            return [(i, out[row, width:].tolist()) for row, i in enumerate(batch)]

        arrivals = [r.arrival_s for r in requests]
        busy = lambda: bool(waiting)  # noqa: E731
        start, wall, tokens, _ = drive(arrivals, waiting.append, generate_batch, busy, on_tokens)
        return EngineRun(self.name, wall, self._records(workload, tokens, stamps, start))


class OneAtATimeEngine(HFStaticEngine):
    name = "one-at-a-time"
    batch_size = 1


class HFContinuousBatchingEngine(_HFEngine):
    name = "hf-cb"

    def load(self) -> dict:
        # Its manager logs a psutil hint and memory breakdowns at ERROR/WARNING level on a CPU.
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
        lim = self.limits
        self.sizes = dict(
            page_size=lim.block_size,
            num_blocks=lim.num_kv_blocks,
            max_batch_tokens=lim.max_num_batched_tokens,
            max_requests_per_batch=lim.max_num_seqs,
        )
        return {**super().load(), **self.sizes}

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        requests = workload.requests
        generation_config = GenerationConfig(
            eos_token_id=-1,
            pad_token_id=self.model.generation_config.pad_token_id,
            max_new_tokens=max(r.max_tokens for r in requests),
            **_sampling(workload),
        )
        config = ContinuousBatchingConfig(
            **self.sizes,
            max_blocks_per_request=0,  # the flash-attention decode path; not on a CPU
            use_cuda_graph=False,
            use_async_batching=False,
            seed=requests[0].seed,
        )
        manager = self.model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=config
        )
        with torch.inference_mode():  # the generation thread copies the caller's mode
            manager.start()
        # The thread builds its batch processor (and allocates the paged cache) first thing;
        # that is set-up, not serving, so the clock starts once it is there.
        while manager.batch_processor is None and manager.is_running():
            time.sleep(0.002)
        in_flight: set[int] = set()
        stamps: dict[int, list[float]] = {}

        def add(i: int) -> None:
            r = requests[i]
            manager.add_request(
                list(r.prompt_token_ids),
                request_id=str(i),
                max_new_tokens=r.max_tokens,
                record_timestamps=True,
                eos_token_id=-1,
            )
            in_flight.add(i)

        def collect() -> list[tuple[int, list[int]]]:
            """The next finished request, if one finishes within 5 ms (then new arrivals)."""
            result = manager.get_result(timeout=0.005)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread died")
                return []
            if result.error is not None:
                raise RuntimeError(f"transformers CB request failed: {result.error}")
            i = int(result.request_id)
            in_flight.discard(i)
            stamps[i] = result.timestamps
            return [(i, list(result.generated_tokens))]

        try:
            arrivals = [r.arrival_s for r in requests]
            start, _, tokens, _ = drive(arrivals, add, collect, lambda: bool(in_flight), on_tokens)
        finally:
            manager.stop(block=True, timeout=10)
            manager.destroy()
        wall = max(t[-1] for t in stamps.values() if t) - start  # to the last token
        return EngineRun(self.name, wall, self._records(workload, tokens, stamps, start))
