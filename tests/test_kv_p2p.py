"""Disaggregated prefill and decode (`kv_transfer/p2p.py`): KV that crosses engines changes no token.

Two engines in one test process, joined by the real transport (torch.distributed gloo on
loopback): a producer runs each prompt with max_tokens=1 and sends its KV, a consumer loads it
and decodes. The oracles:
- greedy output equals transformers' `generate`, under scheduling configs that force
  preemption and chunk prefills on either side, prefix caching on and off;
- the consumer's `num_cached_tokens` is every full block before the last prompt token (the
  prompt was received, not computed), and every block it loaded is one the producer sent;
- the KV that arrives is the producer's, bit for bit;
- faults lose nothing and leak no block: a transfer that never arrives (timeout), a producer
  that dies mid-message (a real second process), a consumer that dies, a prompt larger than the
  consumer's free blocks; a restarted engine is joined again;
- bad configurations are refused, naming the bad value.
"""

from __future__ import annotations

import datetime
import gc
import itertools
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parity import MAX_TOKENS, make_prompts
from tiny_models import VOCAB_SIZE, hf_greedy, make_model

from nanovllm import LLM, SamplingParams
from nanovllm.events import KVBlockLoaded, KVBlockReceived, KVBlockSaved, KVLoadFailed
from nanovllm.kv_transfer.factory import checked_config

REPO = Path(__file__).resolve().parents[1]
_transfer_ids = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def p2p(role: str, port: int, **extra) -> dict:
    return {
        "kv_connector": "P2pConnector",
        "kv_role": role,
        "kv_port": port,
        "kv_connector_extra_config": extra,
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    path = make_model(tmp_path_factory.mktemp("p2p"), arch="llama", num_heads=4, num_kv_heads=2)
    prompts = make_prompts(VOCAB_SIZE)
    return path, prompts, hf_greedy(path, prompts, MAX_TOKENS)


def greedy(transfer_id: str, remote: str, max_tokens: int = MAX_TOKENS) -> SamplingParams:
    """`remote`: "decode" for the producer's half, "prefill" for the consumer's."""
    params = {f"do_remote_{remote}": True, "transfer_id": transfer_id}
    return SamplingParams(
        temperature=0,
        max_tokens=max_tokens,
        ignore_eos=True,
        extra_args={"kv_transfer_params": params},
    )


def disaggregated(producer: LLM, consumer: LLM, prompts: list[list[int]], timeout: float = 30):
    """Every prompt prefilled on the producer, then decoded on the consumer (the proxy's order,
    with the consumer's server's wait): the consumer's outputs."""
    tids = [f"t{next(_transfer_ids)}" for _ in prompts]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    producer.generate(inputs, [greedy(t, "decode", 1) for t in tids], use_tqdm=False)
    transport = consumer.llm_engine.kv_source.transport
    for t in tids:
        assert transport.wait_for_transfer(t, timeout) is None
    return consumer.generate(inputs, [greedy(t, "prefill") for t in tids], use_tqdm=False)


def pair(path: Path, producer_options: dict, consumer_options: dict, **extra) -> tuple[LLM, LLM]:
    port = free_port()
    consumer = LLM(
        str(path), **consumer_options, kv_transfer_config=p2p("kv_consumer", port, **extra)
    )
    producer = LLM(str(path), **producer_options, kv_transfer_config=p2p("kv_producer", port))
    return producer, consumer


def no_leaks(*llms: LLM) -> None:
    for llm in llms:
        assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0, "blocks leaked"


def full_blocks_before_last_token(prompt: list[int], block_size: int) -> int:
    return (len(prompt) - 1) // block_size * block_size


@pytest.mark.quick
def test_the_consumer_receives_the_prompt_and_decodes_it(checkpoint) -> None:
    path, prompts, expected = checkpoint
    producer, consumer = pair(path, dict(block_size=4), dict(block_size=4))
    saved, consumer_events = [], []
    producer.llm_engine.subscribe(saved.append)
    consumer.llm_engine.subscribe(consumer_events.append)
    outs = disaggregated(producer, consumer, prompts)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert [o.num_cached_tokens for o in outs] == [
        full_blocks_before_last_token(p, 4) for p in prompts
    ]
    sent = {e.block_hash for e in saved if isinstance(e, KVBlockSaved)}
    received = {e.block_hash for e in consumer_events if isinstance(e, KVBlockReceived)}
    loaded = {e.block_hash for e in consumer_events if isinstance(e, KVBlockLoaded)}
    assert loaded and loaded <= received <= sent
    no_leaks(producer, consumer)


def test_the_kv_that_arrives_is_the_producers_bit_for_bit(checkpoint) -> None:
    """The staged blocks equal the producer's cache at the blocks it sent (prefix caching keeps
    them there after the request ended)."""
    path, prompts, _ = checkpoint
    options = dict(block_size=4, enable_prefix_caching=True)
    producer, consumer = pair(path, options, options)
    saved = []
    producer.llm_engine.subscribe(saved.append)
    tid = "bits"
    producer.generate([{"prompt_token_ids": prompts[1]}], greedy(tid, "decode", 1), use_tqdm=False)
    transport = consumer.llm_engine.kv_source.transport
    assert transport.wait_for_transfer(tid, 30) is None
    consumer.llm_engine.kv_source.take_received()
    caches = producer.llm_engine.runner.kv_caches
    sends = [e for e in saved if isinstance(e, KVBlockSaved)]
    assert sends
    for e in sends:
        (block,) = [b for h, b in transport.staged.items() if h.hex().startswith(e.block_hash)]
        for layer, (k, v) in enumerate(caches):
            assert torch.equal(block.kv[layer][0], k[e.block_id])
            assert torch.equal(block.kv[layer][1], v[e.block_id])


engine_configs = st.fixed_dictionaries(
    {
        "kv_slots": st.sampled_from([64, 4096]),  # 64 slots forces preemption
        "max_num_batched_tokens": st.sampled_from([5, 17, 2048]),
        "max_num_seqs": st.sampled_from([1, 3, 8]),
        "enable_prefix_caching": st.booleans(),
    }
)


def engine_options(config: dict, block_size: int) -> dict:
    config = dict(config)
    config["num_kv_blocks"] = max(config.pop("kv_slots") // block_size, 1)
    return dict(config, block_size=block_size)


@pytest.mark.slow
@settings(max_examples=examples(6), deadline=None)
@given(
    block_size=st.sampled_from([1, 3, 4, 16]),
    producer_config=engine_configs,
    consumer_config=engine_configs,
    num_staging_blocks=st.sampled_from([2, 1024]),
)
def test_disaggregated_greedy_matches_transformers(
    checkpoint, block_size, producer_config, consumer_config, num_staging_blocks
) -> None:
    """Any scheduling on either side; a staging area too small for a batch's prompts drops
    blocks (those tokens are computed), never a token."""
    path, prompts, expected = checkpoint
    producer, consumer = pair(
        path,
        engine_options(producer_config, block_size),
        engine_options(consumer_config, block_size),
        num_staging_blocks=num_staging_blocks,
    )
    outs = disaggregated(producer, consumer, prompts)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert consumer.llm_engine.scheduler.external_prefix_cache_hits > 0
    no_leaks(producer, consumer)


def test_a_transfer_that_never_arrives_times_out_and_the_prompt_is_computed(checkpoint) -> None:
    path, prompts, expected = checkpoint
    consumer = LLM(
        str(path), block_size=4, kv_transfer_config=p2p("kv_consumer", free_port(), timeout_s=0.3)
    )
    events = []
    consumer.llm_engine.subscribe(events.append)
    start = time.monotonic()
    error = consumer.llm_engine.kv_source.transport.wait_for_transfer("lost", 0.3)
    assert time.monotonic() - start < 5
    assert error == "its KV did not arrive within 0.3 s"
    outs = consumer.generate(
        [{"prompt_token_ids": prompts[1]}], greedy("lost", "prefill"), use_tqdm=False
    )
    assert outs[0].outputs[0].token_ids == expected[1]
    assert outs[0].num_cached_tokens == 0
    failed = [e for e in events if isinstance(e, KVLoadFailed)]
    assert [e.error for e in failed] == [error]
    no_leaks(consumer)


FAKE_PRODUCER = """
import os, sys, time, torch
from nanovllm.kv_transfer.p2p_transport import P2pTransport
from nanovllm.kv_transfer.secret import kv_secret
port, tag = int(sys.argv[1]), sys.argv[2]
link = P2pTransport("127.0.0.1", port, 0, tag, kv_secret())
# The head of a 2-layer message for transfer "cut", then death before its layers.
link.send_blocks(["cut"], [bytes(32)], [(1, 2, 3, 4)], (4, 2, 16), torch.float32, 2)
while not link.outbox.empty() or not link.connected.is_set():
    time.sleep(0.05)
time.sleep(0.5)
os._exit(1)
"""


def run_script(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO)


def test_a_producer_killed_mid_transfer_loses_nothing_and_a_new_one_is_joined(checkpoint) -> None:
    """A real producer process dies after a message's head: the consumer's wait ends at once
    with the reason (not at the timeout), the request computes its prompt, and a restarted
    producer connects to the next session and transfers."""
    path, prompts, expected = checkpoint
    port = free_port()
    consumer = LLM(str(path), block_size=4, kv_transfer_config=p2p("kv_consumer", port))
    transport = consumer.llm_engine.kv_source.transport
    fake = run_script(FAKE_PRODUCER, str(port), consumer.llm_engine.kv_source.model_tag)
    start = time.monotonic()
    error = transport.wait_for_transfer("cut", 20)
    assert fake.wait(30) == 1
    assert error == "the producer disconnected before the transfer ended"
    assert time.monotonic() - start < 20
    outs = consumer.generate(
        [{"prompt_token_ids": prompts[1]}], greedy("cut", "prefill"), use_tqdm=False
    )
    assert outs[0].outputs[0].token_ids == expected[1] and outs[0].num_cached_tokens == 0
    # The producer comes back (here in this process): the link is joined again.
    producer = LLM(str(path), block_size=4, kv_transfer_config=p2p("kv_producer", port))
    outs = disaggregated(producer, consumer, prompts[:2])
    assert [o.outputs[0].token_ids for o in outs] == expected[:2]
    assert outs[1].num_cached_tokens == full_blocks_before_last_token(prompts[1], 4)
    no_leaks(producer, consumer)


FAKE_CONSUMER = """
import os, sys, time
from nanovllm.kv_transfer.p2p_transport import P2pTransport
from nanovllm.kv_transfer.secret import kv_secret
port, tag, transfer, die = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "die"
link = P2pTransport("127.0.0.1", port, 1, tag, kv_secret())
print("listening", flush=True)
error = link.wait_for_transfer(transfer, 60)
print("received", transfer, error, len(link.take_inbox()), flush=True)
os._exit(1 if die else 0)
"""


def test_a_consumer_killed_costs_the_producer_nothing_and_a_new_one_is_joined(checkpoint) -> None:
    path, prompts, expected = checkpoint
    port = free_port()
    producer = LLM(str(path), block_size=4, kv_transfer_config=p2p("kv_producer", port))
    tag = producer.llm_engine.kv_source.model_tag
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def consumer(transfer: str, die: bool) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", FAKE_CONSUMER, str(port), tag, transfer, "die" if die else ""],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "listening"
        return proc

    first = consumer("a", die=True)
    producer.generate(inputs[1:2], greedy("a", "decode", 1), use_tqdm=False)
    out, _ = first.communicate(timeout=60)
    # It received every full block of the prompt, and the transfer's end.
    assert out.split() == ["received", "a", "None", str(len(prompts[1]) // 4)]
    # The consumer is gone: the producer's requests still run, with correct output.
    outs = producer.generate(
        inputs, [greedy(f"b{i}", "decode") for i in range(len(prompts))], use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in outs] == expected
    no_leaks(producer)
    # A consumer comes back on the same port: the producer's next transfer reaches it.
    second = consumer("c", die=False)
    deadline = time.monotonic() + 60
    while second.poll() is None and time.monotonic() < deadline:
        producer.generate(inputs[1:2], greedy("c", "decode", 1), use_tqdm=False)
        time.sleep(0.2)
    out, _ = second.communicate(timeout=10)
    assert out.split()[:3] == ["received", "c", "None"]


def test_a_prompt_larger_than_the_consumers_free_blocks_waits_for_them(checkpoint) -> None:
    """The consumer's cache is nearly full with a long local request: the received prompt waits
    in the queue (its KV in host memory), then loads. A prompt larger than the whole cache is
    refused with the reason, and nothing leaks."""
    path, prompts, expected = checkpoint
    producer, consumer = pair(path, dict(block_size=4), dict(block_size=4, num_kv_blocks=12))
    long_prompt = prompts[1]  # 20 + tail tokens: 6+ blocks of 12
    tid = "big"
    producer.generate([{"prompt_token_ids": long_prompt}], greedy(tid, "decode", 1), use_tqdm=False)
    assert consumer.llm_engine.kv_source.transport.wait_for_transfer(tid, 30) is None
    local = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = consumer.generate(
        [{"prompt_token_ids": prompts[3]}, {"prompt_token_ids": long_prompt}],
        [local, greedy(tid, "prefill")],
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in outs] == [expected[3], expected[1]]
    assert outs[1].num_cached_tokens > 0
    too_long = [{"prompt_token_ids": long_prompt * 3}]
    with pytest.raises(ValueError, match=str(len(long_prompt) * 3)):
        consumer.generate(too_long, greedy("huge", "prefill"), use_tqdm=False)
    no_leaks(producer, consumer)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kv_connector": "P2pConnector", "kv_role": "kv_producer"}, "needs kv_port"),
        ({"kv_connector": "P2pConnector", "kv_role": "kv_both", "kv_port": 1}, "kv_role='kv_both'"),
        ({"kv_connector": "P2pConnector", "kv_port": 0}, "kv_port must be an int in"),
        ({"kv_connector": "P2pConnector", "kv_port": "80"}, "got '80'"),
        ({"kv_connector": "P2pConnector", "kv_ip": "", "kv_port": 9}, "kv_ip must be"),
        (p2p("kv_consumer", 9, timeout_s=0), "timeout_s must be a number > 0, got 0"),
        (dict(p2p("kv_producer", 9), kv_ip="0.0.0.0"), "kv_ip '0.0.0.0' is not an address"),
        (p2p("kv_consumer", 9, num_staging_blocks=0.5), "num_staging_blocks must be an int"),
        (p2p("kv_consumer", 9, shared_storage_path="/tmp"), "unknown keys"),
    ],
)
def test_bad_configurations_are_refused_by_name(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checked_config(config)


def test_each_layer_is_queued_for_sending_before_the_next_layer_runs(checkpoint) -> None:
    """The producer's sends overlap the forward pass: layer i's K and V are on the link's queue
    before layer i + 1 starts computing (a hook after each decoder layer, `executor.py`)."""
    path, prompts, expected = checkpoint
    producer, consumer = pair(path, dict(block_size=4), dict(block_size=4))
    order: list[str] = []
    transport = producer.llm_engine.kv_source.transport
    send_layer = transport.send_layer
    transport.send_layer = lambda k, v: (order.append("sent"), send_layer(k, v))[1]
    layers = producer.llm_engine.runner.model.model.layers
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: order.append(f"layer {i}"))
    outs = disaggregated(producer, consumer, prompts[1:2])
    assert outs[0].outputs[0].token_ids == expected[1]
    step = order[: order.index("sent", order.index(f"layer {len(layers) - 1}")) + 1]
    assert step == [x for i in range(len(layers)) for x in (f"layer {i}", "sent")]


def test_a_session_that_fails_to_start_leaves_the_port_to_the_next_attempt(monkeypatch) -> None:
    """The group of a session fails to form (twice): the producer tries again after
    `RECONNECT_S` (no busy loop), the consumer hears it, and the transfer arrives."""
    from nanovllm.kv_transfer import p2p_transport
    from nanovllm.kv_transfer.p2p_transport import CONSUMER, PRODUCER, P2pTransport

    attempts = []
    real = p2p_transport._group

    def failing_twice(*args: object):
        attempts.append(time.monotonic())
        if len(attempts) <= 2:
            raise RuntimeError("the rendezvous failed")
        return real(*args)

    monkeypatch.setattr(p2p_transport, "_group", failing_twice)
    port = free_port()
    consumer = P2pTransport("127.0.0.1", port, CONSUMER, "tag", "secret")
    producer = P2pTransport("127.0.0.1", port, PRODUCER, "tag", "secret")
    try:
        started = time.monotonic()
        while consumer.transfer_error("t") is None and time.monotonic() - started < 20:
            send_one_block(producer, "t")
            if consumer.wait_for_transfer("t", 0.5) is None:
                break
            consumer.transfers.pop("t")  # (timed out: forget it, and send again)
        assert consumer.wait_for_transfer("t", 0) is None
        assert len(attempts) <= 2 * ((time.monotonic() - started) / p2p_transport.RECONNECT_S + 2)
    finally:
        producer.close()
        consumer.close()


def send_one_block(link, transfer: str) -> None:
    """A one-block, one-layer BLOCKS message and its DONE, queued on a producer's link."""
    shape = (4, 2, 16)  # (block_size, heads, dim)
    link.send_blocks([transfer], [bytes(32)], [(1, 2, 3, 4)], shape, torch.float32, 1)
    kv = torch.ones(1, *shape)
    link.send_layer(kv, kv)
    link.send_done(transfer, 1)


def sent_or_dropped(link, n: int) -> None:
    deadline = time.monotonic() + 20
    while (link.num_dropped < n and not link.outbox.empty()) and time.monotonic() < deadline:
        time.sleep(0.05)


def stranger_attack(port: int) -> list[str] | None:
    """What a client that knows no secret finds on the KV port as a store's client: the keys it
    lists (None: the port does not answer as a store within 3 s). It then does what it can
    with them: sets each to a session no producer waits in (the old port's weakness: a
    producer read that key to learn which session to join, and waited there 30 s)."""
    found: list[list[str]] = []

    def attack() -> None:
        try:
            timeout = datetime.timedelta(seconds=1)
            store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            keys = store.list_keys()
            found.append(keys)
            for key in keys:
                store.set(key, "999")
        except (RuntimeError, OSError):
            pass

    thread = threading.Thread(target=attack, daemon=True)  # (left to end when the port closes)
    thread.start()
    thread.join(3)
    return found[0] if found else None


def test_the_kv_port_listens_on_kv_ip_alone_and_admits_only_who_holds_the_secret(
    monkeypatch,
) -> None:
    """The consumer's port is on kv_ip (loopback) alone. A client without the KV secret lists
    no key there and cannot keep the producer that holds it from joining; joiners that never
    answer the challenge are dropped within HANDSHAKE_S and do not delay it; a producer with
    another secret is refused, and no KV of its arrives. The producer that holds it transfers."""
    from listeners import listening

    from nanovllm.kv_transfer import p2p_transport
    from nanovllm.kv_transfer.p2p_transport import CONSUMER, PRODUCER, P2pTransport

    monkeypatch.setattr(p2p_transport, "HANDSHAKE_S", 1.0)
    port = free_port()
    consumer = P2pTransport("127.0.0.1", port, CONSUMER, "tag", "the secret")
    wrong = right = None
    silent = []
    try:
        assert [a for a, p in listening(os.getpid()) if p == port] == ["127.0.0.1"]
        assert not stranger_attack(port)  # None, or an empty list: nothing to read or write

        wrong = P2pTransport("127.0.0.1", port, PRODUCER, "tag", "another secret")
        send_one_block(wrong, "wrong")
        sent_or_dropped(wrong, 1)
        assert wrong.num_dropped >= 1 and not wrong.connected.is_set()
        deadline = time.monotonic() + 20
        while consumer.num_refused == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert consumer.num_refused >= 1 and consumer.num_sessions == 0

        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        started = time.monotonic()
        right = P2pTransport("127.0.0.1", port, PRODUCER, "tag", "the secret")
        send_one_block(right, "right")
        assert consumer.wait_for_transfer("right", 20) is None
        assert time.monotonic() - started < p2p_transport.HANDSHAKE_S  # the silent ones wait
        assert [b.transfer_id for b in consumer.take_inbox()] == ["right"]
        assert consumer.transfer_error("wrong") is None and "wrong" not in consumer.transfers
        for joiner in silent:  # each got its challenge, never answered, and was dropped
            joiner.settimeout(p2p_transport.HANDSHAKE_S + 5)
            assert len(joiner.recv(64)) == p2p_transport.CHALLENGE_LEN
            assert joiner.recv(64) == b""
        assert time.monotonic() - started < p2p_transport.HANDSHAKE_S + 2
    finally:
        for link in (consumer, wrong, right):
            if link is not None:
                link.close()
        for joiner in silent:
            joiner.close()


def test_engines_let_go_free_the_kv_port_for_the_next_pair(checkpoint) -> None:
    """A notebook re-runs its cell: a pair of engines let go (`del`, the collector off) frees
    the consumer's port at once, and a new pair on the same port transfers as the first did."""
    from listeners import listening

    path, prompts, expected = checkpoint
    port = free_port()
    gc.disable()
    try:
        for _ in range(2):
            consumer = LLM(str(path), block_size=4, kv_transfer_config=p2p("kv_consumer", port))
            producer = LLM(str(path), block_size=4, kv_transfer_config=p2p("kv_producer", port))
            outs = disaggregated(producer, consumer, prompts[2:3])
            assert outs[0].outputs[0].token_ids == expected[2]
            assert outs[0].num_cached_tokens == full_blocks_before_last_token(prompts[2], 4)
            del producer, consumer
            assert port not in [p for _, p in listening(os.getpid())]
    finally:
        gc.enable()
