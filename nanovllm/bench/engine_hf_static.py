"""transformers' `generate` with static, left-padded batches: what most people write first.

Requests are cut into batches of `batch_size` in workload order. Each batch is left-padded to
its longest prompt and generated for as many tokens as its longest request asks for, so shorter
requests keep computing past what they wanted; only the tokens each request asked for are
counted (and their times). With `batch_size=1` this is "one request at a time", the plain
for-loop over prompts.

Online workloads are served like a simple dynamic-batching server: whenever the model is idle,
the requests that have arrived (up to `batch_size`) form the next batch.

Token times come from a streamer: `generate` calls `put()` once with the prompt and then once
per decoding step with the whole batch's new tokens, so one timestamp per step serves every
request in the batch.

EOS is disabled in both `model.generation_config` and `model.config`; with either left set,
`generate` stops a sequence at the EOS id even when asked for more.
"""

from __future__ import annotations

import time

import torch

from nanovllm.bench.engine_base import TokenCallback, wait_until
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.workload import BenchRequest, Workload


class _StepTimes:
    """A `generate` streamer that records when each decoding step's tokens appear."""

    def __init__(self, on_step=None) -> None:
        self.times: list[float] = []
        self._prompt_seen = False
        self._on_step = on_step

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True  # the first call carries the prompt
            return
        self.times.append(time.perf_counter())
        if self._on_step is not None:
            self._on_step()

    def end(self) -> None:
        pass


def load_hf_model(model_path: str):
    """The checkpoint in transformers, fp32, with EOS disabled everywhere."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    pad = model.config.pad_token_id
    model.generation_config.pad_token_id = 0 if pad is None else pad
    return model


class HFStaticEngine:
    def __init__(self, model_path: str, batch_size: int = 16, name: str = "hf-static") -> None:
        self.name = name
        self.model_path = model_path
        self.batch_size = batch_size
        self.model = None

    def load(self) -> dict:
        self.model = load_hf_model(self.model_path)
        return {"attn_implementation": self.model.config._attn_implementation}

    def _generate(
        self, batch: list[BenchRequest], workload: Workload, start: float, on_tokens
    ) -> list[RequestRecord]:
        pad = self.model.generation_config.pad_token_id
        width = max(r.num_prompt_tokens for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            n = r.num_prompt_tokens
            ids[row, width - n :] = torch.tensor(r.prompt_token_ids)
            mask[row, width - n :] = 1
        new_tokens = max(r.max_tokens for r in batch)
        sampling: dict = {"do_sample": False}
        if not workload.greedy:
            sampling = dict(
                do_sample=True, temperature=workload.temperature, top_p=workload.top_p, top_k=0
            )
            torch.manual_seed(batch[0].seed or 0)

        def step_done() -> None:
            if on_tokens is not None:
                on_tokens(sum(1 for r in batch if r.max_tokens >= len(streamer.times)))

        streamer = _StepTimes(step_done)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,  # EOS is disabled, so exactly this many
                pad_token_id=pad,
                streamer=streamer,
                **sampling,
            )
        generated = out[:, width:].tolist()
        times = [t - start for t in streamer.times]
        return [
            RequestRecord(generated[row][: r.max_tokens], times[: r.max_tokens], r.arrival_s)
            for row, r in enumerate(batch)
        ]

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        requests = workload.requests
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        records: list[RequestRecord | None] = [None] * len(requests)
        nxt = 0
        start = time.perf_counter()
        while nxt < len(order):
            now = time.perf_counter() - start
            if requests[order[nxt]].arrival_s > now:
                wait_until(start, requests[order[nxt]].arrival_s)
                now = time.perf_counter() - start
            batch_idx = []
            while (
                nxt < len(order)
                and len(batch_idx) < self.batch_size
                and requests[order[nxt]].arrival_s <= now
            ):
                batch_idx.append(order[nxt])
                nxt += 1
            batch = [requests[i] for i in batch_idx]
            for i, rec in zip(batch_idx, self._generate(batch, workload, start, on_tokens)):
                records[i] = rec
        wall = time.perf_counter() - start
        return EngineRun(self.name, wall, records, {"batch_size": self.batch_size})

    def close(self) -> None:
        self.model = None


def pick_batch_size(
    engine: HFStaticEngine, workload: Workload, candidates: list[int], on_tokens=None
) -> tuple[int, dict[int, float]]:
    """The batch size with the highest output tokens/s on `workload` (a calibration pass)."""
    rates: dict[int, float] = {}
    for bs in candidates:
        engine.batch_size = bs
        rates[bs] = engine.run(workload, on_tokens).output_tokens_per_s
    best = max(rates, key=rates.get)
    engine.batch_size = best
    return best, rates
