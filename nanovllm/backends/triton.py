"""The Triton backend ("triton", the default on a GPU): the paged-attention and KV-write kernels.

Attention is the one part of the model that reads the step's layout; on a GPU it should read
K/V where they lie, through the block tables, rather than gather copies of them as
`TorchAttention` does. `nanovllm.kernels` holds the Triton kernels for that (each beside its
torch reference): `store_kvcache` writes the step's K/V through the slot mapping,
`paged_attention` attends over the paged context, one launch for decode, prefill and chunks.

On a GPU the runner is `CudaModelRunner` (`cuda_runner.py`): inputs staged in one copy, the
forward pass timed with events, and with `enforce_eager=False` decode steps replayed from CUDA
graphs, which only this backend can serve (the torch backend plans its decode gathers from
Python lists, which a graph would freeze). A GGUF file's Q8_0 and Q4_0 weights stay quantized
and are multiplied by a Triton dequantizing matmul (`triton_quantized.py`). On a CPU the kernels run through Triton's
interpreter, thousands of times slower: a teaching and correctness path.
"""

from __future__ import annotations

import torch

from nanovllm.backends import Backend
from nanovllm.executor.model_runner import ModelRunner
from nanovllm.models.attention import AttentionMetadata
from nanovllm.models.model_layers import ModelLayers


class TritonAttention:
    """`TorchAttention`'s interface over the kernels of `nanovllm.kernels` (its sliding window
    and soft-capping too)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        from nanovllm.kernels import checks
        from nanovllm.kernels.paged_attention import paged_attention
        from nanovllm.kernels.store_kvcache import store_kvcache

        checks.check_window_and_soft_cap(sliding_window, logits_soft_cap)
        self._paged_attention = paged_attention
        self._store_kvcache = store_kvcache
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap

    def forward(self, q, k, v, key_cache, value_cache, meta: AttentionMetadata) -> torch.Tensor:
        self._store_kvcache(k, v, key_cache, value_cache, meta.slot_mapping)
        return self._paged_attention(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            self.scale,
            max_query_len=max(meta.query_lens_list),  # known on the host: no GPU read-back
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
        )


class TritonBackend(Backend):
    name = "triton"
    attention_class = TritonAttention

    def check_supported(self, block_size: int, head_dim: int) -> None:
        from nanovllm.kernels.paged_attention import check_supported

        check_supported(block_size, head_dim)

    def runner_class(self, device: torch.device) -> type[ModelRunner]:
        from nanovllm.backends.cuda_runner import CudaModelRunner

        return CudaModelRunner  # (on a CPU too, for its graphs' tests: see cuda_runner.py)

    def captures_cuda_graphs(self) -> bool:
        return True

    def quantized_layers(
        self,
        layers: ModelLayers,
        dtype: torch.dtype,
        device: torch.device,
        enforce_eager: bool,
        int8_activations: bool = False,
    ) -> ModelLayers:
        """Q8_0 and Q4_0 layers through the Triton dequantizing matmul (`triton_quantized.py`)."""
        from nanovllm.backends.triton_quantized import triton_quantized_layers

        return triton_quantized_layers(layers)
