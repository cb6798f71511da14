"""KVConnectorExecutor: the step's forward pass, with the connector's transfers around it.

The model runner stays as it is; this wraps whatever runs a step (`execute(sched)`) and does,
in order: bind the step's `KVConnectorMetadata`, `start_load_kv` (saves of blocks about to be
overwritten, then loads), `wait_for_layer_load` for every layer, the step itself,
`save_kv_layer` for every layer, `wait_for_save`. In vLLM the layerwise calls sit inside the
attention layers; here every copy is synchronous, so calling them around the forward pass moves
the same bytes in the same order.
"""

from __future__ import annotations

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.model_runner import ModelRunnerOutput
from nanovllm.kv_transfer.base import KVConnectorBase


class KVConnectorExecutor:
    def __init__(self, executor, connector: KVConnectorBase) -> None:
        self.executor = executor  # a ModelRunner (one rank)
        self.connector = connector  # the worker side

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
                connector.save_kv_layer(layer, kv_cache)
            connector.wait_for_save()
        finally:
            connector.clear_connector_metadata()
        return result
