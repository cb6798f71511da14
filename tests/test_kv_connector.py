"""KV connectors (`nanovllm/kv_transfer/`): KV from outside the device pool changes no token.

The oracles:
- greedy output equals transformers' `generate` with each connector, under scheduling configs
  that force preemption, chunk prefills and evict prefixes from the device pool (so the host
  tier and the shared storage really serve hits);
- KV loaded equals KV computed, bit for bit: a block that an engine loads (from the tier or a
  file) holds exactly the bytes that a plain engine computes for the same prompt in the same
  step shape;
- the scheduler and the KV cache manager with a connector that answers at random (hits of any
  length, loads that fail) keep every invariant of `test_scheduler.py`'s state machine, and every
  request's output is its reference output;
- a load that fails (a file deleted, corrupt, or holding other tokens) means those tokens are
  computed: no wrong token, no leaked block, and the error says what happened;
- bad configurations are refused, naming the bad value.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from budget import examples, steps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize
from test_parity import MAX_TOKENS, make_prompts
from test_scheduler import SETUP_STRATEGIES, SchedulerMachine
from tiny_models import VOCAB_SIZE, hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.config import EngineConfig
from nanovllm.core.extra_tokens import ExtraTokens
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.scheduler import Scheduler, SchedulerOutput
from nanovllm.events import EventBus, KVBlockLoaded, KVLoadFailed
from nanovllm.kv_transfer.base import (
    KVConnectorBase,
    KVConnectorRole,
)
from nanovllm.kv_transfer_config import KVTransferConfig

GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def offload(num_cpu_blocks: int) -> dict:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks},
    }


def storage(path: Path, role: str) -> dict:
    return {
        "kv_connector": "SharedStorageConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    """A tiny Llama (GQA), prompts of which half share a 20-token prefix, and transformers'
    greedy outputs for them."""
    path = make_model(tmp_path_factory.mktemp("kvc"), arch="llama", num_heads=4, num_kv_heads=2)
    prompts = make_prompts(VOCAB_SIZE)
    return path, prompts, hf_greedy(path, prompts, MAX_TOKENS)


def run(path: Path, prompts: list[list[int]], **options) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outs], llm


def twice(prompts: list[list[int]]) -> list[list[int]]:
    """The prompts, then the prompts again: the second round finds the first's KV (in the
    device pool if it is large, else in the tier or the files)."""
    return prompts + prompts


engine_configs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 3, 4, 16]),
        "kv_slots": st.sampled_from([64, 96, 4096]),  # 64 slots forces preemption
        "max_num_batched_tokens": st.sampled_from([5, 17, 2048]),
        "max_num_seqs": st.sampled_from([1, 3, 8]),
    }
)


def engine_options(config: dict) -> dict:
    config = dict(config)
    config["num_kv_blocks"] = max(config.pop("kv_slots") // config["block_size"], 1)
    return config


@pytest.mark.slow
@settings(max_examples=examples(8), deadline=None)
@given(config=engine_configs, num_cpu_blocks=st.sampled_from([1, 2, 8, 256]))
def test_offloading_greedy_matches_transformers(checkpoint, config, num_cpu_blocks) -> None:
    path, prompts, expected = checkpoint
    got, _ = run(
        path, twice(prompts), **engine_options(config), kv_transfer_config=offload(num_cpu_blocks)
    )
    assert got == twice(expected)


@pytest.mark.slow
@settings(max_examples=examples(8), deadline=None)
@given(config=engine_configs, prefix_caching=st.booleans())
def test_shared_storage_greedy_matches_transformers(
    checkpoint, tmp_path_factory, config, prefix_caching
) -> None:
    """A producer computes and saves; a consumer (a second engine) loads what it can."""
    path, prompts, expected = checkpoint
    folder = tmp_path_factory.mktemp("kv")
    options = dict(engine_options(config), enable_prefix_caching=prefix_caching)
    got, _ = run(path, prompts, **options, kv_transfer_config=storage(folder, "kv_producer"))
    assert got == expected
    got, llm = run(path, prompts, **options, kv_transfer_config=storage(folder, "kv_consumer"))
    assert got == expected
    assert llm.llm_engine.scheduler.external_prefix_cache_hits > 0


def test_the_tier_serves_evicted_prefixes_and_counts_them(checkpoint) -> None:
    """A device pool too small to keep the first round's prefixes: without the tier the second
    round computes them again, with it they are loaded, and `num_cached_tokens` counts local
    and external hits (one request at a time: no preemption)."""
    path, prompts, expected = checkpoint
    options = dict(block_size=4, num_kv_blocks=16, max_num_seqs=1)
    _, plain = run(path, twice(prompts), **options)
    llm = LLM(str(path), **options, kv_transfer_config=offload(64))
    outs = llm.generate([{"prompt_token_ids": p} for p in twice(prompts)], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == twice(expected)
    sched = llm.llm_engine.scheduler
    assert sched.external_prefix_cache_hits > 0
    assert plain.llm_engine.scheduler.external_prefix_cache_hits == 0
    assert sum(o.num_cached_tokens for o in outs) == (
        sched.prefix_cache_hits + sched.external_prefix_cache_hits
    )
    assert sched.prefix_cache_hits + sched.external_prefix_cache_hits > (
        plain.llm_engine.scheduler.prefix_cache_hits
    )


# --- KV loaded equals KV computed, bit for bit -------------------------------------------------


def block_kv(llm: LLM) -> dict[bytes, list[torch.Tensor]]:
    """Every block the engine's prefix cache holds, by hash: its K and V in every layer."""
    engine = llm.llm_engine
    return {
        h: [t[block.block_id].clone() for kv in engine.runner.kv_caches for t in kv]
        for h, block in engine.kv_cache_manager.cached_block_hash_to_block.items()
    }


def loaded_kv(llm: LLM) -> dict[bytes, list[torch.Tensor]]:
    """Record the KV of every block right after the connector loads it."""
    worker = llm.llm_engine.executor.executor.connector  # (the step events' wrapper, then its)
    loaded: dict[bytes, list[torch.Tensor]] = {}
    start = worker.start_load_kv

    def recording_start_load_kv() -> None:
        start()
        for t in worker.metadata.loads:
            loaded[t.block_hash] = [x[t.block_id].clone() for kv in worker.kv_caches for x in kv]

    worker.start_load_kv = recording_start_load_kv
    return loaded


@pytest.mark.parametrize("connector", ["offloading", "shared_storage"])
def test_kv_loaded_equals_kv_computed_bit_for_bit(checkpoint, tmp_path, connector) -> None:
    """Each prompt alone, in one step: a plain engine's blocks are the computed KV; the loads of
    an engine that finds them in its tier (after a squeeze evicted them) or in another engine's
    files must be the same bytes."""
    path, prompts, _ = checkpoint
    options = dict(block_size=4, max_num_seqs=1)
    one = SamplingParams(temperature=0, max_tokens=1)
    computed: dict[bytes, list[torch.Tensor]] = {}
    for prompt in prompts:
        plain = LLM(str(path), **options)
        plain.generate([{"prompt_token_ids": prompt}], one, use_tqdm=False)
        computed.update(block_kv(plain))
    if connector == "offloading":
        llm = LLM(str(path), **options, num_kv_blocks=16, kv_transfer_config=offload(64))
    else:
        producer = LLM(str(path), **options, kv_transfer_config=storage(tmp_path, "kv_producer"))
        for prompt in prompts:  # alone, as the plain engines computed them
            producer.generate([{"prompt_token_ids": prompt}], one, use_tqdm=False)
        llm = LLM(str(path), **options, kv_transfer_config=storage(tmp_path, "kv_consumer"))
    loaded = loaded_kv(llm)
    for prompt in twice(prompts):
        llm.generate([{"prompt_token_ids": prompt}], one, use_tqdm=False)
    assert loaded, "nothing was loaded: the test would prove nothing"
    for block_hash, tensors in loaded.items():
        assert all(torch.equal(a, b) for a, b in zip(tensors, computed[block_hash], strict=True))


# --- a connector that answers at random ---------------------------------------------------------


class RandomConnector(KVConnectorBase):
    """A scheduler side that claims a random number of blocks after every local hit, and whose
    loads (done by the machine's fake worker, with the tokens themselves) fail at random."""

    name = "RandomConnector"

    def __init__(self, block_size: int, rng: random.Random) -> None:
        super().__init__(
            KVTransferConfig("RandomConnector"), KVConnectorRole.SCHEDULER, block_size, "test"
        )
        self.rng = rng

    def num_held(self, block_hashes: list[bytes]) -> int:
        return self.rng.randint(0, len(block_hashes))


class ConnectorSchedulerMachine(SchedulerMachine):
    @initialize(
        **SETUP_STRATEGIES,
        seed=st.integers(0, 2**16),
        fail_rate=st.sampled_from([0.0, 0.1, 0.5]),
    )
    def setup(self, seed: int, fail_rate: float, **options) -> None:
        """The same scheduler and KV cache manager, with a connector that answers at random."""
        SchedulerMachine.setup(self, **options)
        self.rng = random.Random(seed)
        self.fail_rate = fail_rate
        self.connector = RandomConnector(self.kv.block_size, self.rng)
        bus = EventBus()
        self.kv = KVCacheManager(
            self.kv.num_blocks, self.kv.block_size, options["prefix_caching"], bus
        )
        extra_tokens = ExtraTokens(num_slots_after=self.lookahead)
        self.scheduler = Scheduler(self.config, self.kv, bus, self.connector, extra_tokens)

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]] | None:
        """The fake worker: each load writes its block's tokens into the fake cache, or fails
        (garbage in the block) and the step is undone, as the engine does."""
        bs = self.kv.block_size
        failed: dict[str, str] = {}
        for t in out.kv_connector_metadata.loads:
            ok = self.rng.random() >= self.fail_rate
            content = list(t.token_ids) if ok else [-1] * bs
            self.runner.cache[t.block_id * bs : (t.block_id + 1) * bs] = content
            if not ok:
                failed[t.request_id] = "injected load failure"
        if failed:
            self.scheduler.rollback_step(out)
            self.connector.load_failed(out.step, failed)
            return None
        return self.runner.execute(out)


ConnectorSchedulerMachine.TestCase.settings = settings(
    max_examples=examples(120), stateful_step_count=steps(25), deadline=None
)
TestConnectorScheduler = ConnectorSchedulerMachine.TestCase


# --- failures -----------------------------------------------------------------------------------


def consumer_after_producer(path: Path, folder: Path, prompts) -> LLM:
    producer = LLM(str(path), block_size=4, kv_transfer_config=storage(folder, "kv_producer"))
    producer.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return LLM(str(path), block_size=4, kv_transfer_config=storage(folder, "kv_consumer"))


def block_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.pt"))


@pytest.mark.parametrize("damage", ["deleted", "corrupt", "other_tokens", "wrong_shape"])
def test_a_failed_load_computes_instead(checkpoint, tmp_path, caplog, damage) -> None:
    """Every file is damaged after the consumer's lookup found it (deleted the moment the load
    is planned) or before (bytes that are no KV file, another block's tokens, a tensor of the
    wrong shape): the load fails with the reason, the tokens are computed, the output is
    transformers', and no block leaks."""
    path, prompts, expected = checkpoint
    llm = consumer_after_producer(path, tmp_path, prompts)
    files = block_files(tmp_path)
    assert files
    if damage == "corrupt":
        for f in files:
            f.write_bytes(b"not a tensor file")
    elif damage == "other_tokens":
        contents = [f.read_bytes() for f in files]
        for f, data in zip(files, contents[1:] + contents[:1]):
            f.write_bytes(data)
    elif damage == "wrong_shape":
        for f in files:
            data = torch.load(f, weights_only=True)
            data["k0"] = data["k0"][:, :1]
            torch.save(data, f)
    events = []
    llm.llm_engine.subscribe(events.append)
    if damage == "deleted":

        def delete_planned_loads(event) -> None:
            if isinstance(event, KVBlockLoaded):
                for f in files:
                    f.unlink(missing_ok=True)

        llm.llm_engine.subscribe(delete_planned_loads)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0
    failures = [e for e in events if isinstance(e, KVLoadFailed)]
    assert failures, "no load failed: the damage was not seen"
    reason = {
        "deleted": "No such file",
        "corrupt": "cannot load",
        "other_tokens": "other tokens",
        "wrong_shape": "the cache needs",
    }[damage]
    assert all(reason in e.error for e in failures), failures[0].error
    assert reason in caplog.text and "computing those tokens instead" in caplog.text


def test_a_full_tier_drops_saves_and_changes_no_token(checkpoint) -> None:
    """One host slot: almost every eviction finds the tier full (its one entry replaced, or
    pinned by a load in the same step); greedy output is still transformers'."""
    path, prompts, expected = checkpoint
    got, llm = run(path, twice(prompts), block_size=1, num_kv_blocks=64,
                   kv_transfer_config=offload(1))  # fmt: skip
    assert got == twice(expected)
    assert len(llm.llm_engine.kv_source.tier) == 1


# --- bad configurations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"kv_connector": "LMCacheConnectorV1"}, "'LMCacheConnectorV1'"),
        ({"kv_connector": "OffloadingConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"num_cpu_blocks": 4}}, "kv_role='kv_producer'"),
        ({"kv_connector": "OffloadingConnector", "kv_role": "kv_server"}, "'kv_server'"),
        ({"kv_connector": "OffloadingConnector"}, "num_cpu_blocks"),
        ({"kv_connector": "OffloadingConnector",
          "kv_connector_extra_config": {"num_cpu_blocks": 0}}, "got 0"),
        ({"kv_connector": "OffloadingConnector",
          "kv_connector_extra_config": {"num_cpu_blocks": True}}, "got True"),
        ({"kv_connector": "OffloadingConnector",
          "kv_connector_extra_config": {"num_cpu_blocks": 4, "cpu_bytes": 9}}, "['cpu_bytes']"),
        ({"kv_connector": "SharedStorageConnector",
          "kv_connector_extra_config": {"shared_storage_path": "/no/such/folder"}},
         "'/no/such/folder'"),
        ({"kv_connector": "SharedStorageConnector"}, "shared_storage_path"),
        ({"kv_connector": 3}, "got 3"),
        ({"kv_connector": "OffloadingConnector", "role": "kv_both"}, "['role']"),
        ("OffloadingConnector", "'OffloadingConnector'"),
    ],
)  # fmt: skip
def test_bad_configurations_are_refused_naming_the_value(config, named) -> None:
    with pytest.raises(ValueError) as info:
        LLM(num_kv_blocks=8, kv_transfer_config=config)
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(tensor_parallel_size=2), "tensor_parallel_size=2"),
        (dict(enable_prefix_caching=False), "enable_prefix_caching"),
    ],
)
def test_what_a_connector_cannot_run_with_is_refused(options, named) -> None:
    with pytest.raises(ValueError, match=named):
        EngineConfig(kv_transfer_config=offload(4), **options)
