"""nanovllm: a compact, readable, working LLM inference engine in vLLM's design.

    from nanovllm import LLM, SamplingParams

Start reading at `engine/llm_engine.py` (the step loop), then `core/scheduler.py`,
`core/kv_cache_manager.py`, `executor/model_runner.py` and `models/llama.py`.

The names below are imported lazily, on first use (PEP 562's module `__getattr__`, as vLLM
does): `import nanovllm` loads neither torch nor the engine, so the `nanovllm` command answers
`--help` without paying for them, and `from nanovllm import LLM` loads them only then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name -> the module that defines it.
_LAZY: dict[str, str] = {
    "LLM": "nanovllm.engine.llm",
    "LLMEngine": "nanovllm.engine.llm_engine",
    "EngineConfig": "nanovllm.config",
    "SamplingParams": "nanovllm.sampling_params",
    "StructuredOutputsParams": "nanovllm.sampling_params",
    "RequestOutput": "nanovllm.engine.outputs",
    "CompletionOutput": "nanovllm.engine.outputs",
    "TextPrompt": "nanovllm.inputs",
    "TokensPrompt": "nanovllm.inputs",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; nothing is imported at run time
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm import LLM
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.engine.outputs import CompletionOutput, RequestOutput
    from nanovllm.inputs import TextPrompt, TokensPrompt
    from nanovllm.sampling_params import SamplingParams, StructuredOutputsParams


def __getattr__(name: str) -> Any:
    """Called only for names not yet in the module: import the defining module, then cache."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nanovllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute, no call
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
