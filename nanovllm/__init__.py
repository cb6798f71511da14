"""nanovllm: a compact, readable, working LLM inference engine in vLLM's design.

    from nanovllm import LLM, SamplingParams

Start reading at `engine/llm_engine.py` (the step loop), then `core/scheduler.py`,
`core/kv_cache_manager.py`, `executor/model_runner.py` and `models/llama.py`.
"""

from nanovllm.config import EngineConfig
from nanovllm.engine.llm import LLM
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.engine.outputs import CompletionOutput, RequestOutput
from nanovllm.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"
