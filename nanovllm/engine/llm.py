"""LLM: the offline, batch API, shaped like vLLM's.

    from nanovllm import LLM, SamplingParams
    llm = LLM()                                   # the embedded Shakespeare model
    outputs = llm.generate(["ROMEO:"], SamplingParams(temperature=0.8, max_tokens=64))
    print(outputs[0].outputs[0].text)

`generate` hands every prompt to the engine at once and steps until all are done; continuous
batching does the rest. Outputs come back in the order of the prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanovllm.config import EngineConfig
from nanovllm.engine.llm_engine import LLMEngine, Prompt
from nanovllm.engine.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, **engine_options) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_options))
        self._counter = 0

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # a single prompt
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(prompts)} prompts"
                )
        engine = self.llm_engine
        ids = []
        try:
            for prompt, params in zip(prompts, params_list):
                self._counter += 1
                ids.append(str(self._counter))
                engine.add_request(ids[-1], prompt, params)
        except ValueError:
            for request_id in ids[:-1]:  # a bad prompt: take back the ones already queued
                engine.abort_request(request_id)
            engine.step()  # drain the abort outputs
            raise
        final: dict[str, RequestOutput] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    final[output.request_id] = output
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[request_id] for request_id in ids]


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
