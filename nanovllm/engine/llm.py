"""LLM: the offline, batch API, shaped like vLLM's.

    from nanovllm import LLM, SamplingParams
    llm = LLM()                                   # the embedded Shakespeare model
    outputs = llm.generate(["ROMEO:"], SamplingParams(temperature=0.8, max_tokens=64))
    print(outputs[0].outputs[0].text)

    llm = LLM("path/to/chat-model")
    outputs = llm.chat([{"role": "user", "content": "Hello!"}], SamplingParams(max_tokens=64))

`generate` hands every prompt to the engine at once and steps until all are done; continuous
batching does the rest. Outputs come back in the order of the prompts. A prompt is text, a
list of token ids, or vLLM's `TextPrompt` / `TokensPrompt` dict (see `nanovllm/inputs.py`).
`chat` renders each conversation through the tokenizer's chat template (`chat_utils.py`) and
generates from the result, so a script written against vLLM's `LLM` runs here unchanged.

An `LLM` holds processes, ports and a process group under tensor parallelism, and a KV
connector's link. They are released the moment it is done with, not whenever the garbage
collector runs, so a notebook cell that builds a new `LLM` can run again at once:

    llm.shutdown()                                # explicit (vLLM's name)
    with LLM(path, tensor_parallel_size=2) as llm: ...   # on leaving the block
    del llm                                       # on the last reference's end
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from nanovllm.chat_utils import render_chat, resolve_chat_template
from nanovllm.config import EngineConfig
from nanovllm.engine.input_processor import tokenize_prompt
from nanovllm.engine.llm_engine import LLMEngine, Prompt
from nanovllm.engine.outputs import RequestOutput
from nanovllm.inputs import check_prompt_dict
from nanovllm.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    encode_truncated,
    truncate_prompt,
)

logger = logging.getLogger("nanovllm")


class LLM:
    def __init__(self, model: str | None = None, **engine_options) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_options))
        self._counter = 0

    def shutdown(self) -> None:
        """Release the engine's worker processes, ports, process group and KV link now. Safe to
        call twice. (The engine itself sits in reference cycles, so only the garbage collector
        would reach its own `__del__`: this object, outside them, does it at once.)"""
        engine = getattr(self, "llm_engine", None)  # (None: __init__ failed half-way)
        if engine is not None:
            engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # (at interpreter exit, what it would call may be torn down already)
            pass

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """`tokenization_kwargs`: vLLM's, `{"truncate_prompt_tokens": k}` keeps each prompt's
        last k tokens (-1: as many as fit, max_model_len - 1; more than max_model_len is a
        ValueError), a text prompt cut by the tokenizer (the special tokens it adds kept: a BOS
        stays first and counts in the k) and its output keeping the text given, as vLLM's."""
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # a single prompt
        prompts = list(prompts)
        for prompt in prompts:
            if isinstance(prompt, dict):
                check_prompt_dict(prompt)
        k = _truncate_prompt_tokens(tokenization_kwargs)
        if k is not None:
            tokenizer, max_model_len = self.llm_engine.tokenizer, self.llm_engine.max_model_len
            prompts = [_truncated(tokenizer, p, k, max_model_len) for p in prompts]
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
        # Only each request's last output is kept: ask for that one alone (as vLLM's `LLM`
        # does), so the engine builds no output for a request until it finishes.
        params_list = [_final_only(p) for p in params_list]
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

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation, or to a list of conversations (vLLM's `chat`).

        A conversation is a list of OpenAI-style messages (`{"role": ..., "content": ...}`,
        content a string or a list of text parts). `chat_template` (Jinja text) replaces the
        tokenizer's own; without either, a `ValueError` names the model.
        """
        if not messages:
            raise ValueError("messages is empty: pass a conversation or a list of them")
        single = isinstance(messages[0], Mapping)
        conversations = [messages] if single else list(messages)
        tokenizer = self.get_tokenizer()
        template = resolve_chat_template(
            tokenizer,
            chat_template,
            str(self.llm_engine.model_path),
            fix="pass chat_template= (a Jinja template string) to LLM.chat, or use "
            "LLM.generate with a plain text prompt",
        )
        prompts = [
            render_chat(
                tokenizer,
                conversation,
                template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
            )
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _final_only(params: SamplingParams) -> SamplingParams:
    if not isinstance(params, SamplingParams):
        return params  # (add_request names the bad value)
    return dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)


# The tokenization options vLLM 0.32's renderer honours besides truncate_prompt_tokens
# (`TokenizeParams.with_kwargs`): each would change the prompt, so one is refused, not ignored.
VLLM_TOKENIZATION_KWARGS = (
    "add_special_tokens",
    "do_lower_case",
    "max_length",
    "needs_detokenization",
    "pad_prompt_tokens",
    "padding",
    "truncation",
    "truncation_side",
)


def _truncate_prompt_tokens(tokenization_kwargs: Mapping[str, Any] | None) -> int | None:
    """The one tokenization option `generate` takes (vLLM's); vLLM's others are a ValueError
    naming them, and keys vLLM does not know either are ignored with its warning."""
    kwargs = dict(tokenization_kwargs or {})
    k = kwargs.pop("truncate_prompt_tokens", None)
    if refused := sorted(set(kwargs) & set(VLLM_TOKENIZATION_KWARGS)):
        raise ValueError(
            f"tokenization_kwargs: {refused} not supported (only 'truncate_prompt_tokens')"
        )
    if kwargs:
        logger.warning(
            "The following tokenization arguments are not supported and will be ignored: %s",
            kwargs,
        )
    return k


def _truncated(tokenizer: Any, prompt: Prompt, k: int, max_model_len: int) -> dict[str, Any]:
    """`prompt` as token ids cut to its last k, with the text it was given (vLLM's output
    reports that text)."""
    if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
        prompt = prompt.get("prompt", prompt)  # (a dict without either: tokenize_prompt says so)
    if isinstance(prompt, str):  # the tokenizer cuts it
        text, token_ids = prompt, encode_truncated(tokenizer, prompt, k, max_model_len)
    else:
        text, token_ids = tokenize_prompt(tokenizer, prompt)
        _, token_ids = truncate_prompt((None, token_ids), k, max_model_len)
    return {"prompt_token_ids": token_ids, **({"prompt": text} if text is not None else {})}
