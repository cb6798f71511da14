"""Where the KV lives: KV connectors, vLLM's way to keep KV outside the device pool.

- `nanovllm/kv_transfer_config.py` (beside this package, as `speculative_config.py` is):
  `KVTransferConfig`, the `kv_transfer_config` dict's shape checked;
- `base.py`: `KVConnectorBase`, the scheduler-side and worker-side methods, and what passes
  between them each step (`KVConnectorMetadata`);
- `host_tier.py`: `HostBlockTier`, the LRU bookkeeping of a host-memory tier;
- `offloading.py`: `OffloadingConnector`, the tier under the device pool's prefix cache;
- `shared_storage.py`: `SharedStorageConnector`, KV saved to files and loaded by another engine;
- `factory.py`: the connectors by name; `executor.py`: the transfers around the forward pass.
"""
