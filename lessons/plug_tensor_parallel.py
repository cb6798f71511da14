"""Lesson 14's `--run`: the learner's sharding and combining inside a real tensor-parallel engine.

With `tensor_parallel_size=2` the engine builds each rank's model in that rank's own process:
rank 0 in this one, rank 1 in a worker it spawns (`nanovllm/engine/tensor_parallel.py`). So the
learner's code must reach every one of those processes before the model is built: it goes in as
the engine's part `model_layers` (`nanovllm/engine/parts.py`), which the engine carries to every
rank (pickled) and calls there to get the classes the model's layers are built from
(`nanovllm/models/model_layers.py`). `your_model_layers` gives a `YourModelLayers`: a picklable
object that holds only the path of the learner's file. In each rank's process it loads that file
and gives the engine's layers, except that the parallel ones are subclasses whose weight loaders
cut with the learner's functions and whose forward passes combine with them:

    qkv            QKVParallelLinear           q, k, v: the rows of `heads_of_rank`'s heads
    merged_column  MergedColumnParallelLinear  gate, up: `column_shard` of each
    row            RowParallelLinear           o_proj, down_proj: `row_shard`; forward:
                                               `reduce_rows`
    embedding      VocabParallelEmbedding      the embedding table: `column_shard` of its
                                               vocabulary rows; forward: `reduce_rows` of the
                                               ranks' lookups (a rank looks up only the tokens
                                               in its rows, zeros for the others)
    lm_head        ParallelLMHead              forward: `gather_columns` of the ranks' logits

The engine's own layers combine with an all-reduce (a sum computed by torch.distributed) or an
all-gather. Here every combination is an all-gather of the ranks' partial results, after which
each rank applies the learner's function to the list of them: the same result on every rank,
computed by the learner's code. Norms are whole on every rank, as in the engine.

Each rank reads whole checkpoint tensors and cuts them in memory (the learner's functions take
tensors), where the engine's loaders read only their slice from the file: the same weights in
the end, and the demo model's whole checkpoint is 17 MB. Before anything starts, `check_on_the_model`
runs the learner's functions on the model's shapes for every rank, so a wrong shape is reported
by name here rather than as a dead worker process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nanovllm.distributed.communication import tensor_model_parallel_all_gather
from nanovllm.lessons.catalog import load_file
from nanovllm.lessons.plug import LessonRunError
from nanovllm.models.embedding import ParallelLMHead, VocabParallelEmbedding, pad_vocab_size
from nanovllm.models.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    check_shape,
)
from nanovllm.models.model_layers import ModelLayers


def _whole(loaded_weight: Any) -> torch.Tensor:
    """The whole checkpoint tensor (a lazy safetensors view is read in full)."""
    if isinstance(loaded_weight, torch.Tensor):
        return loaded_weight
    return loaded_weight.narrow(0, 0, loaded_weight.shape[0])


def _shaped(what: str, got: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """`got` if it is a tensor of `shape`; LessonRunError naming the function otherwise."""
    got_shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    if got_shape != tuple(shape):
        raise LessonRunError(f"your {what} gave {got_shape}; the engine needs {tuple(shape)}")
    return got


def _every_rank(x: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `x`, in rank order, on every rank (one all-gather; [x] without a group)."""
    return list(tensor_model_parallel_all_gather(x.unsqueeze(0), dim=0).unbind(0))


def your_layer_classes(impl: Any) -> dict[str, type]:
    """The engine's parallel layers, cutting and combining with `impl`'s functions (by their
    names in `ModelLayers`)."""

    class YourQKVParallelLinear(QKVParallelLinear):
        def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
            if shard_id is None:  # a fused [q; k; v] tensor: the stock loader splits it
                return super().weight_loader(param, loaded_weight, None)
            q_heads, kv_heads = impl.heads_of_rank(
                self.tp_rank, self.tp_size, self.total_num_heads, self.total_num_kv_heads
            )
            heads = [int(h) for h in (q_heads if shard_id == "q" else kv_heads)]
            offset = {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard_id]
            size = self.q_size if shard_id == "q" else self.kv_size
            whole, d = _whole(loaded_weight), self.head_size
            rows = torch.cat([whole[h * d : (h + 1) * d] for h in heads])  # this rank's heads
            piece = _shaped(
                f"heads_of_rank's {shard_id} heads {heads}", rows, (size, *rows.shape[1:])
            )
            param.data.narrow(0, offset, size).copy_(piece)

    class YourMergedColumnParallelLinear(MergedColumnParallelLinear):
        def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
            if shard_id is None:  # gate and up fused in one tensor: the stock loader splits it
                return super().weight_loader(param, loaded_weight, None)
            n = self.output_sizes[shard_id] // self.tp_size
            offset = sum(self.output_sizes[:shard_id]) // self.tp_size
            piece = impl.column_shard(_whole(loaded_weight), self.tp_rank, self.tp_size)
            piece = _shaped("column_shard", piece, (n, *param.shape[1:]))
            param.data.narrow(0, offset, n).copy_(piece)

    class YourRowParallelLinear(RowParallelLinear):
        def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
            if param is self.bias:  # whole on every rank
                return super().weight_loader(param, loaded_weight)
            check_shape(type(self).__name__, loaded_weight, (self.output_size, self.input_size))
            piece = impl.row_shard(_whole(loaded_weight), self.tp_rank, self.tp_size)
            param.data.copy_(_shaped("row_shard", piece, tuple(param.shape)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.reduce_results:  # the caller sums the partials itself
                return super().forward(x)
            if not self.input_is_parallel:
                n = self.input_size_per_partition
                x = x.narrow(-1, self.tp_rank * n, n)
            partial = F.linear(x, self.weight)  # [num_tokens, output_size]: no bias yet
            return impl.reduce_rows(_every_rank(partial), self.bias)

    def load_vocabulary(self, param, loaded_weight, shard_id=None) -> None:
        check_shape(type(self).__name__, loaded_weight, (self.num_embeddings, *param.shape[1:]))
        whole = _whole(loaded_weight)
        padding = self.num_embeddings_padded - self.num_embeddings  # zero rows, never chosen
        if padding:
            whole = torch.cat([whole, whole.new_zeros(padding, *whole.shape[1:])])
        piece = impl.column_shard(whole, self.tp_rank, self.tp_size)
        param.data.copy_(_shaped("column_shard", piece, tuple(param.shape)))

    class YourVocabParallelEmbedding(VocabParallelEmbedding):
        weight_loader = load_vocabulary

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            # [num_tokens]: True where this rank holds the token's row
            mine = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
            local_ids = torch.where(mine, input_ids - self.vocab_start_index, 0)
            partial = F.embedding(local_ids, self.weight).masked_fill(~mine.unsqueeze(-1), 0)
            return impl.reduce_rows(_every_rank(partial), None)  # [num_tokens, hidden]

    class YourParallelLMHead(ParallelLMHead):
        weight_loader = load_vocabulary

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            logits = F.linear(hidden, self.weight, self.bias)  # [num_tokens, padded_vocab / tp]
            return impl.gather_columns(_every_rank(logits))[..., : self.num_embeddings]

    return {
        "qkv": YourQKVParallelLinear,
        "merged_column": YourMergedColumnParallelLinear,
        "row": YourRowParallelLinear,
        "embedding": YourVocabParallelEmbedding,
        "lm_head": YourParallelLMHead,
    }


class YourModelLayers:
    """The engine's part `model_layers`, with the learner's parallel layers in the model.

    Picklable (it holds a path, no code), so the engine can send it to every rank's process,
    where it loads the learner's file afresh. It counts the models built from it in its own
    process (`num_built`: rank 0's, in the process that built the engine).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.num_built = 0

    def __call__(self, attention: type) -> ModelLayers:
        layers = ModelLayers(attention, **your_layer_classes(load_file(Path(self.path))))
        self.num_built += 1
        return layers


def check_on_the_model(impl: Any, model_path: str | Path, tensor_parallel_size: int) -> None:
    """Run `impl`'s functions on the shapes of the model at `model_path` for every rank, and
    raise LessonRunError, naming the function and the rank, where a result's shape would not
    fit the engine's parameters."""
    from nanovllm.models.loader import load_model_args

    _, args = load_model_args(Path(model_path))
    tp = tensor_parallel_size
    heads, kv = args.num_attention_heads, args.num_key_value_heads
    hidden, inter = args.hidden_size, args.intermediate_size
    vocab = pad_vocab_size(args.vocab_size, tp)
    for rank in range(tp):
        q_heads, kv_heads = impl.heads_of_rank(rank, tp, heads, kv)
        for what, got, count, total in (
            ("query heads", q_heads, heads // tp, heads),
            ("KV heads", kv_heads, max(1, kv // tp), kv),
        ):
            got = [int(h) for h in got]
            if len(got) != count or not all(0 <= h < total for h in got):
                raise LessonRunError(
                    f"your heads_of_rank gave rank {rank} of {tp} the {what} {got}: the engine "
                    f"needs {count} of the model's {total}"
                )
        for name, fn, shape, want in (
            ("column_shard", impl.column_shard, (inter, hidden), (inter // tp, hidden)),
            ("column_shard", impl.column_shard, (vocab, hidden), (vocab // tp, hidden)),
            ("row_shard", impl.row_shard, (hidden, inter), (hidden, inter // tp)),
        ):
            _shaped(
                f"{name} of a {shape} weight for rank {rank}",
                fn(torch.zeros(shape), rank, tp),
                want,
            )
    tokens = 3
    _shaped(
        f"gather_columns of {tp} ranks' logits",
        impl.gather_columns([torch.zeros(tokens, vocab // tp) for _ in range(tp)]),
        (tokens, vocab),
    )
    _shaped(
        f"reduce_rows of {tp} partials",
        impl.reduce_rows([torch.zeros(tokens, hidden) for _ in range(tp)], None),
        (tokens, hidden),
    )


def your_model_layers(
    impl: Any, model_path: str | Path, tensor_parallel_size: int
) -> YourModelLayers:
    """The part `model_layers` whose layers cut and combine with `impl`'s functions, on every
    rank (see the module docstring), once `impl`'s functions are checked on the model's shapes.
    `impl` must be a file's module: every rank's process loads it."""
    path = getattr(impl, "__file__", None)
    if not path:
        raise LessonRunError(
            "lesson 14's --run loads your code in every rank's process, so it needs it as a "
            "file (nanovllm lesson 14 --run --against FILE)"
        )
    check_on_the_model(impl, model_path, tensor_parallel_size)
    return YourModelLayers(str(path))


def is_yours(engine) -> bool:
    """Whether `engine`'s model (rank 0's shard) was built from the learner's layers: its part
    `model_layers` is a `YourModelLayers` that built it."""
    part = engine.config.parts.model_layers if engine.config.parts is not None else None
    return isinstance(part, YourModelLayers) and part.num_built > 0
