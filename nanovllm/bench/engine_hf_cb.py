"""transformers' own continuous batching (`init_continuous_batching`), sized like nanovllm.

transformers 5.x ships a paged-KV continuous-batching manager: a background thread schedules
requests into token-budgeted batches, much as nanovllm does. Left to itself it sizes its cache
and batches from GPU memory, which on a CPU means guesses; the adapter passes explicit
`ContinuousBatchingConfig` sizes equal to nanovllm's instead (same KV slots, same token budget,
same concurrent-request cap, same page size), so the two schedule under the same limits.

A fresh manager is made (and started) for every run, before the clock starts, so no run finds
the previous run's prompts in its prefix cache. Requests are added one by one (each asks for
its own `max_new_tokens`; `generate_batch` would give all of them one length) with
`eos_token_id=-1` (never matches) and `record_timestamps=True`, which stamps each generated
token with `time.perf_counter()` in the generation thread.
"""

from __future__ import annotations

import logging
import time

import torch

from nanovllm.bench.engine_base import TokenCallback
from nanovllm.bench.engine_hf_static import load_hf_model
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.bench.workload import Workload


class HFContinuousBatchingEngine:
    def __init__(
        self,
        model_path: str,
        page_size: int = 16,
        num_blocks: int = 4096,
        max_batch_tokens: int = 2048,
        max_requests_per_batch: int = 64,
        name: str = "hf-cb",
    ) -> None:
        self.name = name
        self.model_path = model_path
        self.sizes = dict(
            page_size=page_size,
            num_blocks=num_blocks,
            max_batch_tokens=max_batch_tokens,
            max_requests_per_batch=max_requests_per_batch,
        )
        self.model = None

    def load(self) -> dict:
        # Its manager logs a psutil hint and memory breakdowns at ERROR/WARNING level on a CPU.
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
        self.model = load_hf_model(self.model_path)
        return dict(self.sizes)

    def _manager(self, workload: Workload):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        sampling: dict = {"do_sample": False}
        if not workload.greedy:
            sampling = dict(
                do_sample=True, temperature=workload.temperature, top_p=workload.top_p, top_k=0
            )
        generation_config = GenerationConfig(
            eos_token_id=-1,
            pad_token_id=self.model.generation_config.pad_token_id,
            max_new_tokens=max(r.max_tokens for r in workload.requests),
            **sampling,
        )
        config = ContinuousBatchingConfig(
            **self.sizes,
            max_blocks_per_request=0,  # the flash-attention decode path; not on a CPU
            use_cuda_graph=False,
            use_async_batching=False,
            seed=workload.requests[0].seed,
        )
        return self.model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=config
        )

    def run(self, workload: Workload, on_tokens: TokenCallback | None = None) -> EngineRun:
        requests = workload.requests
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        manager = self._manager(workload)
        with torch.inference_mode():  # the generation thread copies the caller's mode
            manager.start()
        # The thread builds its batch processor (and allocates the paged cache) first thing;
        # that is set-up, not serving, so the clock starts once it is there.
        while manager.batch_processor is None and manager.is_running():
            time.sleep(0.002)
        results = {}
        nxt = 0
        try:
            start = time.perf_counter()
            while len(results) < len(requests):
                now = time.perf_counter() - start
                while nxt < len(order) and requests[order[nxt]].arrival_s <= now:
                    i = order[nxt]
                    manager.add_request(
                        list(requests[i].prompt_token_ids),
                        request_id=str(i),
                        max_new_tokens=requests[i].max_tokens,
                        record_timestamps=True,
                        eos_token_id=-1,
                    )
                    nxt += 1
                wait = requests[order[nxt]].arrival_s - now if nxt < len(order) else 1.0
                result = manager.get_result(timeout=max(wait, 0.001))
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching thread died")
                    continue
                if result.is_finished():
                    if result.error is not None:
                        raise RuntimeError(f"transformers CB request failed: {result.error}")
                    results[int(result.request_id)] = result
                    if on_tokens is not None:
                        on_tokens(len(result.generated_tokens))
            wall = max(r.timestamps[-1] for r in results.values() if r.timestamps) - start
        finally:
            manager.stop(block=True, timeout=10)
            manager.destroy()
        records = []
        for i, r in enumerate(requests):
            out = results[i]
            n = r.max_tokens
            times = [t - start for t in (out.timestamps or [])]
            records.append(RequestRecord(list(out.generated_tokens[:n]), times[:n], r.arrival_s))
        return EngineRun(self.name, wall, records, dict(self.sizes))

    def close(self) -> None:
        self.model = None
