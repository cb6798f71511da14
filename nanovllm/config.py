"""EngineConfig: every knob of the engine in one place, checked once.

Names follow vLLM's engine arguments so that what a learner tunes here carries over:
`block_size`, `num_kv_blocks` (vLLM: `num_gpu_blocks_override`), `max_num_seqs`,
`max_num_batched_tokens`, `max_model_len`, `enable_prefix_caching`, `enable_chunked_prefill`,
`dtype`, `seed`, plus `attention_backend` ("cpu", "triton" or "torch"; "torch" is the plain
torch model, for reading and teaching: no numba or Triton kernel anywhere in it).

The KV cache is sized by `num_kv_blocks` directly, or by `kv_cache_memory_bytes` (a memory
budget, converted into blocks once the model's shape is known), or else measured: on a GPU, what
`gpu_memory_utilization` of its memory leaves after the weights and the largest step's
activations (`executor/memory.py`); on a CPU, a quarter of the available memory, at most
4 GiB (`executor/memory.py`, `cpu_kv_cache_budget`).

`enforce_eager` is vLLM's name with vLLM's meaning (True: no torch.compile, no CUDA graphs),
but the opposite default: True, the model runs eagerly. `enforce_eager=False` compiles each
layer's per-token work with inductor (`backends/compilation.py`) and, on a GPU with the Triton
backend, replays decode steps from CUDA graphs (`backends/cuda_graphs.py`). Eager is the default
because compiling costs seconds at every start-up (a test suite builds hundreds of engines) and
did not raise the bench's CPU throughput (figures: nanovllm/bench/README.md, "Compiling the
model").

`kv_transfer_config` is vLLM's: a KV connector (`nanovllm/kv_transfer/`), e.g.
`{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"num_cpu_blocks": 256}}`.

`dtype="auto"` (the default, as in vLLM) runs the checkpoint's own half precision on a GPU and
float32 on a CPU, where half-precision matmuls are slow (`models/loader.py`, `resolve_dtype`).

A bad value is a `ValueError` that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EngineConfig:
    model: str | None = None  # checkpoint folder or GGUF file; None = the embedded default model
    tokenizer: str | None = None  # its tokenizer's folder or GGUF file; None = the model's own
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None  # used when num_kv_blocks is None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory the engine may use
    seed: int = 0
    attention_backend: str | None = None  # None: the fastest where we run
    device: str | None = None  # None: cuda if available, else cpu
    num_threads: int | None = None  # torch CPU threads; None leaves torch's default
    # Speculative decoding, vLLM's shape: {"method": "ngram", "num_speculative_tokens": k, ...}
    speculative_config: dict | None = None
    # Tensor parallelism: the model cut across this many processes (`engine/tensor_parallel.py`)
    tensor_parallel_size: int = 1
    # True: no torch.compile, no CUDA graphs (vLLM's meaning; the default here, see above)
    enforce_eager: bool = True
    # A KV connector, vLLM's shape: {"kv_connector": NAME, "kv_role": ..., ...} (`kv_transfer/`)
    kv_transfer_config: dict | None = None
    # The parts the engine is built from, an `EngineParts` (`engine/parts.py`: a lesson gives
    # the learner's); None: the engine's own.
    parts: Any = None
    # vLLM's: schedule step N+1 while step N's forward pass runs (`engine/async_step.py`)
    async_scheduling: bool = False
    # vLLM's: every layer's KV kept as full attention's, one KV cache group, windows or not
    # (`core/kv_cache_interface.py`; the layers still attend within their windows)
    disable_hybrid_kv_cache_manager: bool = False
    # vLLM's: a mixture of experts' experts spread whole over the tensor-parallel ranks, instead
    # of each cut across them (`models/moe_expert_parallel.py`)
    enable_expert_parallel: bool = False
    # A GGUF file's Q8_0, Q4_0 and Q4_1 weights are kept quantized in memory (False, the
    # default: `models/quantized_linear.py`), or dequantized to `dtype` at load (True)
    dequantize_gguf: bool = False
    # With weights kept quantized, on a CPU: round x to int8 blocks too and multiply in integers,
    # as llama.cpp does (`backends/cpu_quantized_int8.py`: faster, and no longer the reference's
    # arithmetic, so greedy tokens may part from it); False: the exact numba layers
    gguf_int8_activations: bool = False

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "tensor_parallel_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.num_kv_blocks is not None and (
            not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1
        ):
            raise ValueError(f"num_kv_blocks must be an int >= 1, got {self.num_kv_blocks!r}")
        if self.kv_cache_memory_bytes is not None and (
            not isinstance(self.kv_cache_memory_bytes, int)
            or isinstance(self.kv_cache_memory_bytes, bool)
            or self.kv_cache_memory_bytes < 1
        ):
            raise ValueError(
                f"kv_cache_memory_bytes must be an int >= 1, got {self.kv_cache_memory_bytes!r}"
            )
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 1
        ):
            raise ValueError(f"max_model_len must be an int >= 1, got {self.max_model_len!r}")
        if (
            not isinstance(self.gpu_memory_utilization, int | float)
            or isinstance(self.gpu_memory_utilization, bool)
            or not 0 < self.gpu_memory_utilization <= 1
        ):
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(
                f"dtype must be 'float32', 'bfloat16', 'float16' or 'auto', got {self.dtype!r}"
            )
        if self.speculative_config is not None:
            from nanovllm.speculative_config import SpeculativeConfig

            SpeculativeConfig.from_dict(self.speculative_config)  # a bad value raises here
        if self.kv_transfer_config is not None:
            self.check_kv_transfer_config()
        if self.async_scheduling:
            self.check_async_scheduling()
        if self.attention_backend not in (None, "torch", "cpu", "triton"):
            raise ValueError(
                "attention_backend must be 'torch', 'cpu' or 'triton', got "
                f"{self.attention_backend!r}"
            )

    def check_async_scheduling(self) -> None:
        """ValueError for what async scheduling cannot run with here (as vLLM refuses some)."""
        refused = {
            "speculative_config": self.speculative_config is not None,
            "kv_transfer_config": self.kv_transfer_config is not None,
            "tensor_parallel_size > 1": self.tensor_parallel_size > 1,
        }
        for name, given in refused.items():
            if given:
                raise ValueError(
                    f"async_scheduling=True does not support {name} here: step N+1 is scheduled "
                    "before step N's tokens are known, and this feature needs them (use "
                    "async_scheduling=False)"
                )

    def check_kv_transfer_config(self) -> None:
        """The connector's own checks, then what it needs of the engine."""
        from nanovllm.kv_transfer_config import KVTransferConfig

        kv = KVTransferConfig.from_dict(self.kv_transfer_config)
        if self.tensor_parallel_size > 1:
            raise ValueError(
                f"kv_transfer_config with tensor_parallel_size={self.tensor_parallel_size} is "
                "not supported: the connector moves rank 0's KV cache only"
            )
        if kv.kv_connector == "OffloadingConnector" and not self.enable_prefix_caching:
            raise ValueError(
                "OffloadingConnector needs enable_prefix_caching=True: its tier holds the "
                "blocks the prefix cache evicts, found again by their hashes"
            )
