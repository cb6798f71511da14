"""Linear layers cut across tensor-parallel ranks (Megatron-style), and fused for speed.

A linear layer y = x W^T + b (W: [out, in]) can be split over N ranks in two ways:

- Column-parallel: each rank holds N-th of W's *rows* (output features). Every rank sees the
  whole input x and computes its slice of y; no communication is needed unless someone wants
  the whole y (then an all-gather).
- Row-parallel: each rank holds N-th of W's *columns* (input features). Every rank needs only
  its slice of x, and computes a partial y; summing the partials over the ranks (an all-reduce)
  gives the whole y. The bias is added once (by rank 0), not N times.

A transformer block pairs them so only one all-reduce per sub-layer is needed: attention's
q/k/v projections are column-parallel by heads (each rank runs whole heads, no communication),
and the output projection is row-parallel (its input is exactly the heads this rank computed);
likewise the MLP's gate/up are column-parallel and down is row-parallel.

Fusion rides along: `QKVParallelLinear` holds q, k and v stacked in one weight, and
`MergedColumnParallelLinear` gate and up, so each is ONE matmul instead of three or two. That
is why these classes are used at tensor-parallel size 1 too, where they are a plain `F.linear`
with no communication at all. Every layer multiplies through one method, `matmul`, which a
backend may give a faster class (`nanovllm/backends/cpu_linear.py`).

Every parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that takes the
checkpoint's FULL tensor (Hugging Face's `q_proj.weight`, `gate_proj.weight`, ...) and copies in
this rank's slice, at its place in the fused layout. `loaded_weight` need only offer `.shape`
and `.narrow(dim, start, length)`: a torch.Tensor does, and so does a lazy safetensors view
(`nanovllm.models.sharded_loader`), which then reads from the file only the slice asked for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed.communication import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from nanovllm.distributed.parallel_state import get_tp_rank, get_tp_world_size

# A checkpoint tensor: a torch.Tensor, or anything with `.shape` and `.narrow(dim, start, n)`.
LoadedWeight = Any


def divide(numerator: int, denominator: int, what: str, by: str = "tensor_parallel_size") -> int:
    """numerator / denominator, which must be exact (each rank gets an equal slice)."""
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by {by}={denominator}")
    return numerator // denominator


def check_shape(name: str, loaded_weight: LoadedWeight, expected: tuple[int, ...]) -> None:
    """A clear error when a checkpoint tensor's shape is not the full shape this layer expects."""
    if tuple(loaded_weight.shape) != tuple(expected):
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded_weight.shape)}, expected "
            f"{tuple(expected)}"
        )


def new_parameter(*shape: int, dtype: torch.dtype | None, weight_loader) -> nn.Parameter:
    """An inference parameter (no grad), uninitialised, that knows how to load its slice."""
    # torch.empty honours `with torch.device(...)`, so layers are built where the caller wants.
    param = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    param.weight_loader = weight_loader
    return param


class LinearBase(nn.Module):
    """What every parallel linear layer shares: its place in the group and its parameters."""

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.input_size, self.output_size = input_size, output_size

    def create_parameters(
        self, weight_shape: tuple[int, int], bias_size: int | None, dtype: torch.dtype | None
    ) -> None:
        """This rank's weight [out, in] and bias [out] (None: no bias), each with the loader."""
        self.weight = new_parameter(*weight_shape, dtype=dtype, weight_loader=self.weight_loader)
        self.bias = (
            new_parameter(bias_size, dtype=dtype, weight_loader=self.weight_loader)
            if bias_size is not None
            else None
        )

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + b with this rank's weight: [num_tokens, in] -> [num_tokens, out]."""
        return F.linear(x, self.weight, bias)

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, tp_size={self.tp_size}, "
            f"bias={self.bias is not None}"
        )


class ColumnParallelLinear(LinearBase):
    """y = x W^T + b with W's rows (output features) split across ranks.

    x: [num_tokens, input_size] (whole, on every rank)
    -> [num_tokens, output_size / tp] (this rank's slice), or [num_tokens, output_size] with
    `gather_output=True` (an all-gather).
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(input_size, output_size)
        self.output_size_per_partition = divide(output_size, self.tp_size, "output_size")
        self.gather_output = gather_output
        n = self.output_size_per_partition
        self.create_parameters((n, input_size), n if bias else None, params_dtype)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: Any = None
    ) -> None:
        """Copy rows [rank * n, (rank + 1) * n) of the full weight (or bias)."""
        n = param.shape[0]
        check_shape(type(self).__name__, loaded_weight, (n * self.tp_size, *param.shape[1:]))
        param.data.copy_(loaded_weight.narrow(0, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [num_tokens, output_size / tp]
        y = self.matmul(x, self.bias)
        if self.gather_output and self.tp_size > 1:
            y = tensor_model_parallel_all_gather(y, dim=-1)  # [num_tokens, output_size]
        return y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel layers of the same input fused into one matmul.

    The Llama MLP's gate_proj and up_proj: `output_sizes = [intermediate, intermediate]`. This
    rank's weight stacks its slice of each: [gate_r; up_r], so the output is
    [num_tokens, sum(output_sizes) / tp] and splits into this rank's gate and up halves. Loading
    takes each full HF tensor with its index as `shard_id` (gate_proj -> 0, up_proj -> 1).
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        gather_output: bool = False,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        self.output_sizes = list(output_sizes)
        tp_size = get_tp_world_size()
        for size in self.output_sizes:
            divide(size, tp_size, "output_sizes entry")
        super().__init__(input_size, sum(self.output_sizes), bias, gather_output, params_dtype)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: int | None = None
    ) -> None:
        """Copy this rank's slice of output `shard_id`'s full tensor to its place in the fusion.

        shard_id None: `loaded_weight` is already the full fused tensor [sum(output_sizes), ...].
        """
        if shard_id is None:
            check_shape(type(self).__name__, loaded_weight, (self.output_size, *param.shape[1:]))
            offset = 0
            for i, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(0, offset, size), i)
                offset += size
            return
        if not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"{type(self).__name__}: shard_id {shard_id!r} is not one of "
                f"0..{len(self.output_sizes) - 1}"
            )
        full = self.output_sizes[shard_id]
        check_shape(
            f"{type(self).__name__} shard {shard_id}", loaded_weight, (full, *param.shape[1:])
        )
        n = full // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, n).copy_(loaded_weight.narrow(0, self.tp_rank * n, n))


class QKVParallelLinear(ColumnParallelLinear):
    """Attention's q, k and v projections fused into one matmul, split across ranks by heads.

    Each rank holds num_heads / tp query heads and their key/value heads, stacked as
    [q_r; k_r; v_r]: the output [num_tokens, q_size + 2 * kv_size] splits into this rank's q, k
    and v (`q_size`, `kv_size` are per rank).

    With grouped-query attention there may be fewer KV heads than ranks. A rank cannot hold a
    fraction of a head, so then each rank holds ONE KV head, copied on tp / num_kv_heads ranks:
    rank r holds KV head r // (tp / num_kv_heads), which is exactly the KV head that its query
    heads attend to.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        tp_size = get_tp_world_size()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.num_heads = divide(total_num_heads, tp_size, "num_attention_heads")
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(
                tp_size, self.total_num_kv_heads, "tensor_parallel_size", "num_key_value_heads"
            )
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp_size, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        self.q_size = self.num_heads * head_size  # per rank
        self.kv_size = self.num_kv_heads * head_size  # per rank
        # The layer's output over all ranks (KV heads counted once per replica).
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias, False, params_dtype)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: str | None = None
    ) -> None:
        """Copy this rank's heads of q_proj ('q'), k_proj ('k') or v_proj ('v') into place.

        shard_id None: `loaded_weight` is a checkpoint's fused [q; k; v] tensor.
        """
        q_full = self.total_num_heads * self.head_size
        kv_full = self.total_num_kv_heads * self.head_size
        rest = tuple(param.shape[1:])
        if shard_id is None:
            check_shape(type(self).__name__, loaded_weight, (q_full + 2 * kv_full, *rest))
            self.weight_loader(param, loaded_weight.narrow(0, 0, q_full), "q")
            self.weight_loader(param, loaded_weight.narrow(0, q_full, kv_full), "k")
            self.weight_loader(param, loaded_weight.narrow(0, q_full + kv_full, kv_full), "v")
            return
        if shard_id == "q":
            offset, n, full, start = 0, self.q_size, q_full, self.tp_rank * self.q_size
        elif shard_id in ("k", "v"):
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            kv_head_group = self.tp_rank // self.num_kv_head_replicas
            n, full, start = self.kv_size, kv_full, kv_head_group * self.kv_size
        else:
            raise ValueError(f"QKVParallelLinear: shard_id {shard_id!r} is not 'q', 'k' or 'v'")
        check_shape(f"QKVParallelLinear shard {shard_id!r}", loaded_weight, (full, *rest))
        param.data.narrow(0, offset, n).copy_(loaded_weight.narrow(0, start, n))

    def extra_repr(self) -> str:
        return (
            f"hidden={self.input_size}, heads={self.total_num_heads}, "
            f"kv_heads={self.total_num_kv_heads}, head_size={self.head_size}, "
            f"tp_size={self.tp_size}, kv_replicas={self.num_kv_head_replicas}, "
            f"bias={self.bias is not None}"
        )


class RowParallelLinear(LinearBase):
    """y = x W^T + b with W's columns (input features) split across ranks, then summed.

    x: [num_tokens, input_size / tp] (this rank's slice, as a column-parallel layer left it), or
    [num_tokens, input_size] with `input_is_parallel=False` (this rank takes its slice)
    -> [num_tokens, output_size], the same on every rank after the all-reduce.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        input_is_parallel: bool = True,
        reduce_results: bool = True,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(input_size, output_size)
        self.input_size_per_partition = divide(input_size, self.tp_size, "input_size")
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        # The bias is whole on every rank but added only by rank 0: the sum then holds it once.
        self.create_parameters(
            (output_size, self.input_size_per_partition),
            output_size if bias else None,
            params_dtype,
        )

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: Any = None
    ) -> None:
        """Weight: copy columns [rank * n, (rank + 1) * n). Bias: copy it whole."""
        if param is self.bias:
            check_shape("RowParallelLinear bias", loaded_weight, tuple(param.shape))
            param.data.copy_(loaded_weight.narrow(0, 0, param.shape[0]))
            return
        n = self.input_size_per_partition
        check_shape("RowParallelLinear", loaded_weight, (self.output_size, self.input_size))
        param.data.copy_(loaded_weight.narrow(1, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, self.bias)
        if not self.input_is_parallel:
            n = self.input_size_per_partition
            x = x.narrow(-1, self.tp_rank * n, n)  # [num_tokens, input_size / tp]
        bias = self.bias if self.tp_rank == 0 else None
        y = self.matmul(x, bias)  # [num_tokens, output_size], partial
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y)
        return y
