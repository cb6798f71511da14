"""Lesson 15 demo: KV that outlives the device pool, in a host tier.

1. Block hashes as addresses: two prompts about the same document, their blocks' hashes side by
   side (equal while the tokens before are equal), and what a block of the demo model's KV is.
2. The real engine with a small device pool over a host tier (the OffloadingConnector): the
   life of the blocks behind the first tier hit, from the engine's events (evicted from the
   pool and saved to a tier slot, loaded back into another device block), and the tier's
   first LRU drop.
3. The same 48 requests with no tier, a small one and one that keeps everything: the same
   greedy outputs, and how many prompt tokens each computed, hit in the pool or loaded.

Run it: `nanovllm lesson 15 --demo` (or `python demo.py`).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nanovllm.lessons.demo_support import make_engine, section

DEVICE_BLOCKS = 40  # as in this lesson's --run


def _tier(num_cpu_blocks: int) -> dict:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks},
    }


def _serve(engine, arrivals) -> dict:
    """Greedy, every request as long as planned; returns the final output of each."""
    from nanovllm.lessons.your_engine import serve

    return serve(engine, arrivals)


def _hashes_of_two_prompts(console: Console, arrivals) -> None:
    from nanovllm.core.block_hash import extend_block_hashes, short
    from nanovllm.executor.memory import kv_bytes_per_block

    engine = make_engine(enable_prefix_caching=True)
    tok = engine.tokenizer
    try:
        # Two requests whose prompts start with the same document (4 lines of Shakespeare).
        by_document: dict[str, list] = {}
        for a in arrivals:
            by_document.setdefault(a.prompt.rsplit("\n", 2)[0], []).append(a)
        first, second = next(
            (a, b)
            for group in by_document.values()
            for a in group
            for b in group
            if a.prompt.rsplit("\n", 2)[1:] != b.prompt.rsplit("\n", 2)[1:]
        )
        table = Table(
            title=f"The full blocks (16 tokens) of two prompts: {first.request_id} and "
            f"{second.request_id}, about the same document"
        )
        for col in ("block", f"{first.request_id}: tokens", "hash", f"{second.request_id}: hash"):
            table.add_column(col)
        ids = [tok.encode(a.prompt) for a in (first, second)]
        hashes: list[list[bytes]] = [[], []]
        for h, t in zip(hashes, ids):
            extend_block_hashes(h, t, 16, len(t))
        for i in range(max(len(hashes[0]), len(hashes[1]))):
            a = short(hashes[0][i]) if i < len(hashes[0]) else ""
            b = short(hashes[1][i]) if i < len(hashes[1]) else ""
            words = tok.decode(ids[0][i * 16 : (i + 1) * 16]) if a else ""
            style = "green" if a == b else "red"
            table.add_row(str(i), repr(words)[:32], f"[{style}]{a}[/]", f"[{style}]{b}[/]")
        console.print(table)
        args = engine.model_args
        block = kv_bytes_per_block(args, 16, engine.dtype)
        console.print(
            "hash(block i) = sha256(hash(block i-1) || its 16 token ids): equal hashes mean "
            "equal tokens in the block and in every block before it, so equal K and V. The "
            "hash is the block's address in every tier: the device pool's prefix cache, the "
            "host tier, files on shared storage. The partial last block has no hash yet. "
            f"One block of this model's KV ({args.num_hidden_layers} layers, "
            f"{args.num_key_value_heads} KV heads of {args.head_dim}, K and V, "
            f"{str(engine.dtype).removeprefix('torch.')}) is {block // 1024} KiB."
        )
    finally:
        engine.shutdown()


def _life_of_a_hit(console: Console, arrivals) -> None:
    from nanovllm.lessons.moments import steps

    tier = 24
    engine = make_engine(
        enable_prefix_caching=True, num_kv_blocks=DEVICE_BLOCKS, kv_transfer_config=_tier(tier)
    )
    events: list = []
    engine.subscribe(events.append)
    try:
        _serve(engine, arrivals)
    finally:
        engine.shutdown()
    # The request that took the most blocks from the host tier in one step (with some from the
    # device pool, among equals), and when each of those blocks was saved.
    saved = {}  # hash -> the KVBlockSaved event that last put it in the tier
    chosen = None  # (step, request id, its hits in the device pool, its loads)
    for step, frame in steps(events):
        loads: dict[str, list] = {}
        for e in frame:
            if type(e).__name__ == "KVBlockLoaded":
                loads.setdefault(e.request_id, []).append(e)
        for rid, its_loads in loads.items():
            hits = [e for e in frame if type(e).__name__ == "CacheHit" and e.request_id == rid]
            rank = (len(its_loads), bool(hits))
            if chosen is None or rank > (len(chosen[3]), bool(chosen[2])):
                chosen = (step, rid, hits, its_loads, dict(saved))
        saved.update((e.block_hash, e) for e in frame if type(e).__name__ == "KVBlockSaved")
    assert chosen is not None, "no tier hit in this run"
    step, rid, hits, loads, saved = chosen
    table = Table(
        title=f"{DEVICE_BLOCKS} device blocks over a host tier of {tier}: the blocks {rid} "
        f"loaded from the tier at step {step}"
    )
    for col in (
        "hash",
        "saved at step",
        "from device block",
        "into tier slot",
        "loaded into block",
    ):
        table.add_column(col, justify="right")
    for e in loads:
        s = saved.get(e.block_hash)
        table.add_row(
            e.block_hash,
            str(s.step) if s else "?",
            str(s.block_id) if s else "?",
            str(e.tier_slot),
            str(e.block_id),
        )
    console.print(table)
    drop = next((e for e in events if type(e).__name__ == "KVTierEvicted"), None)
    if hits:
        found = (
            f"{rid} found the first {len(hits)} blocks of its prompt in the device pool's "
            f"prefix cache (shared, no copy) and the next {len(loads)} in the host tier"
        )
    else:
        found = (
            f"{rid} found none of its prompt's blocks in the device pool's prefix cache, and "
            f"its first {len(loads)} in the host tier"
        )
    console.print(
        found + ": `get_num_new_matched_tokens` counted them, `update_state_after_alloc` "
        "planned a copy into the blocks it was given, and the worker copied them in "
        "(`start_load_kv`) before the forward pass read them. Each had been saved when the "
        "device pool handed its block to another request: the scheduler reports the blocks it "
        "evicts, and `build_connector_meta` has the worker copy them out before the forward "
        "pass overwrites them."
    )
    if drop is not None:
        console.print(
            f"At step {drop.step} the tier was full: it dropped {drop.block_hash}, its least "
            f"recently used block, and gave slot {drop.tier_slot} to the block being saved "
            "(a KVTierEvicted event, then KVBlockSaved)."
        )


def _with_and_without(console: Console, arrivals) -> None:
    from nanovllm.executor.memory import kv_bytes_per_block

    table = Table(
        title=f"{len(arrivals)} requests about 10 documents, {DEVICE_BLOCKS} device blocks of 16 "
        "tokens"
    )
    for col in ("host tier", "prompt tokens computed", "device-pool hits", "tier hits", "saved"):
        table.add_column(col, justify="right")
    outputs = {}
    for tier in (0, 24, 96):
        options = dict(enable_prefix_caching=True, num_kv_blocks=DEVICE_BLOCKS)
        if tier:
            options["kv_transfer_config"] = _tier(tier)
        engine = make_engine(**options)
        events: list = []
        engine.subscribe(events.append)
        try:
            out = _serve(engine, arrivals)
            block = kv_bytes_per_block(engine.model_args, 16, engine.dtype)
            local = engine.stats.prefix_cache_hits
            external = engine.stats.external_prefix_cache_hits
        finally:
            engine.shutdown()
        outputs[tier] = {rid: list(o.outputs[0].token_ids) for rid, o in out.items()}
        prompt = sum(len(o.prompt_token_ids) for o in out.values())
        kinds = [type(e).__name__ for e in events]
        table.add_row(
            f"{tier} blocks" if tier else "none",
            f"{prompt - local - external:,} of {prompt:,}",
            f"{local:,}",
            f"{external:,}",
            f"{kinds.count('KVBlockSaved')}, {kinds.count('KVTierEvicted')} dropped"
            if tier
            else "-",
        )
    console.print(table)
    same = outputs[0] == outputs[24] == outputs[96]
    console.print(
        f"Identical greedy outputs: {same}. The device pool's hits are the same with or "
        "without a tier; the tier adds hits on blocks the pool had already handed to others. "
        "A block loaded back and evicted again is only touched, not saved again: the large "
        "tier saves fewer blocks. Each tier slot holds one block's K and V for every layer "
        f"(the 24-block tier is {24 * block / 2**20:.1f} MiB of host memory here). A hit "
        "is a copy instead of a forward pass over those tokens; here the 'device' is the CPU "
        "too, so both are small. On a GPU the copy crosses PCIe while recomputing costs a "
        "prefill of those tokens: the longer the shared prefix, the more a hit saves."
    )


def run(console: Console) -> None:
    from nanovllm.lessons.workload import make_workload

    arrivals = make_workload("revisits")
    section(console, "1. A block's address is its hash")
    _hashes_of_two_prompts(console, arrivals)
    section(console, "2. Evicted from the device pool, saved to the tier, loaded back")
    _life_of_a_hit(console, arrivals)
    section(console, "3. The same requests with no tier, a small one and a large one")
    _with_and_without(console, arrivals)


if __name__ == "__main__":
    run(Console())
