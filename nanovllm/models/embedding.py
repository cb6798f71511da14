"""The vocabulary cut across tensor-parallel ranks: the token embedding and the LM head.

The embedding table and the LM head are [vocab_size, hidden_size]: with a vocabulary of 150k
tokens they are among a model's largest tensors, so each rank holds only a contiguous range of
the vocabulary's rows. The vocabulary is first padded up to a multiple of the tensor-parallel
size so every rank's range has the same length; the padding rows are zeros and never win.

- `VocabParallelEmbedding`: each rank looks up only the token ids in its range and writes zeros
  for the others; an all-reduce (sum) then gives every rank every token's embedding, since
  exactly one rank contributed each row.
- `ParallelLMHead`: each rank computes the logits of its vocabulary range
  ([num_tokens, padded_vocab / tp]); an all-gather concatenates them in rank order and the
  padding columns are cut off, leaving [num_tokens, vocab_size].

At tensor-parallel size 1 they are a plain `F.embedding` and a plain `F.linear` (`matmul`, which
a backend may give a faster class, as it does the linear layers').
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.distributed.communication import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from nanovllm.distributed.parallel_state import get_tp_rank, get_tp_world_size
from nanovllm.models.linear import LoadedWeight, check_shape, new_parameter


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The smallest multiple of tp_size that is >= vocab_size."""
    return -(-vocab_size // tp_size) * tp_size


class VocabParallelEmbedding(nn.Module):
    """Token ids [num_tokens] -> embeddings [num_tokens, embedding_dim], vocabulary rows split.

    This rank holds rows [vocab_start_index, vocab_end_index) of the padded table. Token ids
    must be < num_embeddings (the engine checks prompts): an id in the padding gets a zero row.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.num_embeddings = num_embeddings  # the real vocabulary
        self.embedding_dim = embedding_dim
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, self.tp_size)
        self.num_embeddings_per_partition = self.num_embeddings_padded // self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.weight = new_parameter(
            self.num_embeddings_per_partition,
            embedding_dim,
            dtype=params_dtype,
            weight_loader=self.weight_loader,
        )

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: LoadedWeight, shard_id: object = None
    ) -> None:
        """Copy this rank's vocabulary rows of the full [vocab_size, ...] tensor; zero the padding."""
        check_shape(type(self).__name__, loaded_weight, (self.num_embeddings, *param.shape[1:]))
        start = self.vocab_start_index
        n_real = max(0, min(self.vocab_end_index, self.num_embeddings) - start)
        if n_real:
            param.data[:n_real].copy_(loaded_weight.narrow(0, start, n_real))
        param.data[n_real:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        # [num_tokens]: True where this rank owns the token's row
        mine = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = torch.where(mine, input_ids - self.vocab_start_index, 0)
        out = F.embedding(local_ids, self.weight)  # [num_tokens, embedding_dim]
        out.masked_fill_(~mine.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)

    def extra_repr(self) -> str:
        return (
            f"vocab={self.num_embeddings}, padded={self.num_embeddings_padded}, "
            f"dim={self.embedding_dim}, tp_size={self.tp_size}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states [num_tokens, embedding_dim] -> logits [num_tokens, num_embeddings].

    Holds the same vocabulary rows as `VocabParallelEmbedding`, so with tied word embeddings
    `tie_weights(embed_tokens)` makes the two share one parameter on every rank.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, params_dtype)
        self.bias = (
            new_parameter(
                self.num_embeddings_per_partition,
                dtype=params_dtype,
                weight_loader=self.weight_loader,
            )
            if bias
            else None
        )

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        """Use the embedding table as the LM head (tie_word_embeddings)."""
        if embed_tokens.num_embeddings_padded != self.num_embeddings_padded:
            raise ValueError("tied embedding and LM head must have the same vocabulary")
        self.weight = embed_tokens.weight
        return self

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + b with this rank's vocabulary rows: -> [num_tokens, padded_vocab / tp]."""
        return F.linear(x, self.weight, bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [num_tokens, padded_vocab / tp]
        logits = self.matmul(hidden, self.bias)
        if self.tp_size == 1:
            return logits  # padded == real vocabulary at size 1
        logits = tensor_model_parallel_all_gather(logits, dim=-1)  # [num_tokens, padded_vocab]
        return logits[..., : self.num_embeddings]
