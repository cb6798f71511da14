"""ModelLayers: the classes the decoder (`llama.py`) builds its layers from, given when it is built.

The decoder does not name the classes of its layers: it is given them, so that a backend can
give its fast versions (its paged attention kernel, numba norms, packed matmuls, compiled
decoder layers: `nanovllm/backends/`), and a lesson its own layers (lesson 14's tensor-parallel
ones cut their weights and combine their ranks' results with the learner's functions; lesson
17's mixtures of experts route and dispatch with them), all chosen before the model is built:
nothing is swapped in a built model or in a module.
`ModelLayers(attention)` is the engine's own layers around that attention class:

    attention      (heads, kv heads, head_dim, scale) -> a layer's paged attention
    qkv            q, k and v as one column-parallel matmul, cut by heads (`linear.py`)
    merged_column  gate and up as one column-parallel matmul (`linear.py`)
    row            o_proj and down_proj: row-parallel, their ranks' results summed (`linear.py`)
    embedding      the token embedding, cut by vocabulary rows (`embedding.py`)
    lm_head        the LM head, cut by vocabulary rows, its ranks' logits gathered
    self_attn      each layer's attention: projections, RoPE, paged attention (`llama.py`)
    rms_norm       every RMSNorm (`layernorm.py`)
    rotary         the rotary position embedding (`rotary.py`)
    decoder_layer  each pre-norm residual block (`llama.py`)
    moe            a sparse layer's mixture of experts: router and experts (`moe.py`)

Each rank builds its own model (`engine/tensor_parallel.py`), so the engine carries, to every
rank's process, a picklable callable that gives the ranks' `ModelLayers`: `EngineParts`'s
`model_layers` (`engine/parts.py`), `ModelLayers` itself by default. Each rank's backend then
replaces the classes it has faster subclasses of (`Backend.model_layers`), and builds the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nanovllm.models.attention import TorchAttention
from nanovllm.models.embedding import ParallelLMHead, VocabParallelEmbedding
from nanovllm.models.layernorm import RMSNorm
from nanovllm.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanovllm.models.llama import Attention, DecoderLayer
from nanovllm.models.moe import SparseMoeBlock
from nanovllm.models.rotary import RotaryEmbedding


@dataclass(frozen=True)
class ModelLayers:
    """The classes of the decoder's layers (see the module docstring)."""

    attention: Callable = TorchAttention
    qkv: Callable[..., QKVParallelLinear] = QKVParallelLinear
    merged_column: Callable[..., MergedColumnParallelLinear] = MergedColumnParallelLinear
    row: Callable[..., RowParallelLinear] = RowParallelLinear
    embedding: Callable[..., VocabParallelEmbedding] = VocabParallelEmbedding
    lm_head: Callable[..., ParallelLMHead] = ParallelLMHead
    self_attn: Callable[..., Attention] = Attention
    rms_norm: Callable[..., RMSNorm] = RMSNorm
    rotary: Callable[..., RotaryEmbedding] = RotaryEmbedding
    decoder_layer: Callable[..., DecoderLayer] = DecoderLayer
    moe: Callable[..., SparseMoeBlock] = SparseMoeBlock
