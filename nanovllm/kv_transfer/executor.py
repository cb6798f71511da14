"""KVConnectorExecutor: the step's forward pass, with the connector's transfers around it.

The model runner stays as it is; this wraps whatever runs a step (`execute(sched)`) and does,
in order: bind the step's `KVConnectorMetadata`, `start_load_kv` (saves of blocks about to be
overwritten, then loads), `wait_for_layer_load` for every layer, the step itself, then
`save_kv_layer` for every layer and `wait_for_save`.

`save_kv_layer(i)` is called as soon as decoder layer i has written this step's KV: a forward
hook on the layer (`register_forward_hook`) calls it, so a connector that sends KV elsewhere
starts on layer 0 while the later layers compute (in vLLM the call sits inside the attention
layer). A layer whose hook did not run (a replayed CUDA graph runs no Python) is saved after the
forward pass; a connector saves each layer once. The loads stay synchronous, before the forward
pass.
"""

from __future__ import annotations

from torch import nn

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.outputs import ModelRunnerOutput
from nanovllm.kv_transfer.base import KVConnectorBase


class KVConnectorExecutor:
    def __init__(self, executor, connector: KVConnectorBase) -> None:
        self.executor = executor  # a ModelRunner (one rank)
        self.connector = connector  # the worker side
        model = getattr(executor, "model", None)
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        for i, layer in enumerate(layers):
            layer.register_forward_hook(self._layer_done_hook(i))

    def _layer_done_hook(self, layer: int):
        def hook(module: nn.Module, args: object, output: object) -> None:
            connector = self.connector
            if connector.metadata is not None:  # (a forward outside a step saves nothing)
                connector.save_kv_layer(layer, connector.kv_caches[layer])

        return hook

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        connector = self.connector
        assert sched.kv_connector_metadata is not None
        connector.bind_connector_metadata(sched.kv_connector_metadata)
        try:
            connector.start_load_kv()  # raises KVLoadError before anything runs
            for layer in range(len(connector.kv_caches)):
                connector.wait_for_layer_load(layer)
            result = self.executor.execute(sched)
            for layer, kv_cache in enumerate(connector.kv_caches):
                connector.save_kv_layer(layer, kv_cache)  # those no hook saved
            connector.wait_for_save()
        finally:
            connector.clear_connector_metadata()
        return result
