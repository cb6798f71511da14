"""The multi-turn workload, its driver, and `nanovllm bench --multi-turn --kv-transfer-config`.

Never asserts a speed. The workload and the driver are checked against the rule they implement
(each turn's prompt is the previous prompt + the previous answer + a new user message; turns
go out round-robin, at most `concurrency` at a time, each after its previous turn's answer),
with a fake engine that answers in an order hypothesis chooses. One short real run on the
embedded model checks the report's counts against independent ones: the prompt tokens and the
reusable prefix computed here from the lengths alone, hits only from the tier's side, the
identity sent = found + computed, and equal greedy outputs. One short main run checks that
`--kv-transfer-config` reaches `nanovllm` and not `nanovllm-no-kv-transfer`.
"""

from __future__ import annotations

import json

import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.bench import quiet
from nanovllm.bench.multi_turn import drive_conversations, multi_turn_workload
from nanovllm.bench.workload import FIRST_PROMPT_ID
from nanovllm.cli import main

OFFLOAD = {
    "kv_connector": "OffloadingConnector",
    "kv_connector_extra_config": {"num_cpu_blocks": 64},
}


@settings(max_examples=examples(40))
@given(
    n=st.integers(1, 6),
    extra=st.integers(0, 3),
    turns=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    user=st.tuples(st.integers(1, 20), st.integers(0, 20)),
    answer=st.tuples(st.integers(1, 20), st.integers(0, 20)),
)
def test_workload_is_seeded_and_in_range(n, extra, turns, seed, user, answer) -> None:
    user_len, answer_len = (user[0], sum(user)), (answer[0], sum(answer))
    w = multi_turn_workload(n, turns, user_len, answer_len, 300, seed)
    assert w == multi_turn_workload(n, turns, user_len, answer_len, 300, seed)
    more = multi_turn_workload(n + extra, turns, user_len, answer_len, 300, seed)
    assert more.user_messages[:n] == w.user_messages and more.answer_lens[:n] == w.answer_lens
    assert (w.num_conversations, w.num_turns, w.num_requests) == (n, turns, n * turns)
    for msgs, lens in zip(w.user_messages, w.answer_lens):
        assert all(user_len[0] <= len(m) <= user_len[1] for m in msgs)
        assert all(FIRST_PROMPT_ID <= tok < 300 for m in msgs for tok in m)
        assert all(answer_len[0] <= a <= answer_len[1] for a in lens)
    assert w.order() == [(c, t) for t in range(turns) for c in range(n)]


@pytest.mark.parametrize("name", ["num_conversations", "num_turns", "concurrency"])
def test_bad_workload_sizes_are_named(name) -> None:
    sizes = {"num_conversations": 2, "num_turns": 2, "concurrency": 1, name: 0}
    with pytest.raises(ValueError, match=name):
        multi_turn_workload(
            sizes["num_conversations"], sizes["num_turns"], (4, 4), (4, 4), 100,
            concurrency=sizes["concurrency"],
        )  # fmt: skip


@settings(max_examples=examples(60))
@given(
    n=st.integers(1, 5),
    turns=st.integers(1, 4),
    concurrency=st.integers(1, 6),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_driver_sends_the_conversation_so_far_round_robin(n, turns, concurrency, seed, data):
    """A fake engine: each step gives one or two tokens to in-flight requests hypothesis picks
    (so turns finish in any order); an answer token is the request's index and position."""
    w = multi_turn_workload(n, turns, (1, 6), (1, 5), 50, seed, concurrency)
    added: list[tuple[int, list[int], int]] = []
    remaining: dict[int, int] = {}  # in flight: request -> tokens still owed
    given_so_far: dict[int, int] = {}

    def add(i: int, prompt: list[int], max_tokens: int) -> None:
        added.append((i, list(prompt), max_tokens))
        remaining[i] = max_tokens
        given_so_far[i] = 0
        assert len(remaining) <= concurrency, "more turns in flight than the concurrency"

    def step():
        live = sorted(remaining)
        picked = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        out = []
        for i in picked:
            k = min(remaining[i], data.draw(st.integers(1, 2)))
            out.append((i, [1000 * i + given_so_far[i] + j for j in range(k)]))
            given_so_far[i] += k
            remaining[i] -= k
            if not remaining[i]:
                del remaining[i]
        return out

    served = drive_conversations(w, add, step)
    # Round-robin, every request once; prompts built from the answers the engine gave.
    assert [i for i, _, _ in added] == [w.index(c, t) for c, t in w.order()]
    prompt_added = {i: prompt for i, prompt, _ in added}
    assert [m for _, _, m in added] == [w.answer_lens[c][t] for c, t in w.order()]
    for c in range(n):
        history: list[int] = []
        for t in range(turns):
            i = w.index(c, t)
            answer = [1000 * i + j for j in range(w.answer_lens[c][t])]
            history = history + w.user_messages[c][t]
            assert served.prompts[i] == history == prompt_added[i]
            assert served.tokens[i] == answer and len(served.times[i]) == len(answer)
            if t:  # sent after the previous turn's last token
                assert served.sent[i] >= served.times[i - 1][-1]
            history = history + answer
    assert sum(map(len, served.prompts)) == w.num_prompt_tokens


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "not JSON"),
        ('{"kv_connector": "Bogus"}', "'Bogus'"),
        ('{"kv_connector": "OffloadingConnector"}', "num_cpu_blocks"),
        (
            '{"kv_connector": "OffloadingConnector", "kv_connector_extra_config": '
            '{"num_cpu_blocks": 0}}',
            "num_cpu_blocks",
        ),
        ('{"kv_connector": "OffloadingConnector", "kv_role": "sender"}', "'sender'"),
        ('{"kv_connector": "OffloadingConnector", "colour": 1}', "colour"),
    ],
)
def test_bad_kv_transfer_configs_are_named(value, message, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--quick", "--kv-transfer-config", value])
    assert message in capsys.readouterr().err


def test_multi_turn_needs_the_offloading_connector_and_room(tmp_path, capsys) -> None:
    assert main(["bench", "--multi-turn"]) == 2
    assert "--kv-transfer-config" in capsys.readouterr().err
    argv = ["bench", "--multi-turn", "--kv-transfer-config", json.dumps(OFFLOAD)]
    assert main([*argv, "--num-turns", "9", "--prompt-len", "64", "--output-len", "64"]) == 2
    assert "max_model_len=1024" in capsys.readouterr().err
    storage = {"kv_connector": "SharedStorageConnector", "kv_connector_extra_config": {}}
    storage["kv_connector_extra_config"]["shared_storage_path"] = str(tmp_path)
    assert main(["bench", "--multi-turn", "--kv-transfer-config", json.dumps(storage)]) == 2
    assert "'SharedStorageConnector'" in capsys.readouterr().err


def test_embedded_model_without_and_with_the_offloading_tier(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(quiet, "wait_until_idle", lambda: 0.0)  # no timing is asserted
    out = tmp_path / "multi.json"
    argv = ["bench", "--multi-turn", "--kv-transfer-config", json.dumps(OFFLOAD), "--threads"]
    argv += ["1", "--repeats", "1", "--num-conversations", "3", "--num-turns", "3"]
    argv += ["--prompt-len", "16:24", "--output-len", "6:10", "--json", str(out)]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "greedy outputs and prompts identical in all 2 runs" in printed

    r = json.loads(out.read_text())
    w = multi_turn_workload(3, 3, (16, 24), (6, 10), 4096, seed=0)
    # The pool holds the 2 turns in flight at their longest: the third conversation's turns
    # evict the others' blocks.
    assert (
        r["num_kv_blocks"]
        == 2 * -(-w.max_seq_len // 16)
        < r["workload"]["blocks_all_conversations"]
    )
    reusable = 0  # each turn after the first: the previous turn's full blocks, last token out
    for msgs, lens in zip(w.user_messages, w.answer_lens):
        sent = 0
        for t in range(3):
            reusable += (sent - 1) // 16 * 16 if t else 0
            sent += len(msgs[t]) + lens[t]
    on, off = r["with"], r["without"]
    assert r["outputs_identical"] and r["prompts_identical"]
    for side in (on, off):
        assert side["num_preemptions"] == 0
        assert side["prompt_tokens"] == r["workload"]["prompt_tokens"] == w.num_prompt_tokens
        assert side["output_tokens"] == w.num_output_tokens
        found = side["local_hits"] + side["external_hits"]
        assert side["num_cached_tokens"] == found  # per request, summed: the same tokens
        assert side["prompt_tokens"] == found + side["computed"]
    assert off["external_hits"] == 0 and off["local_hits"] < reusable
    # A tier that holds every evicted block loses nothing: every reusable token is found.
    assert on["external_hits"] > 0 and on["local_hits"] + on["external_hits"] == reusable
    assert r["ratios"]["computed"] == on["computed"] / off["computed"]
    tok_s = on["tok_s"]["median"] / off["tok_s"]["median"]  # one repeat: one pair
    assert r["ratios"]["tok_s"] == r["ratios"]["paired_tok_s"]["median"] == pytest.approx(tok_s)


def test_main_run_compares_nanovllm_with_and_without_the_connector(tmp_path, monkeypatch):
    """Without --multi-turn: `nanovllm` runs the connector, `nanovllm-no-kv-transfer` does not,
    and the prefix-caching runs (their other side has no prefix cache, which the
    OffloadingConnector needs) still run."""
    monkeypatch.setattr(quiet, "wait_until_idle", lambda: 0.0)
    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--engines", "nanovllm", "--threads", "1", "--json", str(out)]
    assert main([*argv, "--kv-transfer-config", json.dumps(OFFLOAD)]) == 0
    (m,) = json.loads(out.read_text())["models"]
    engines = m["engines"]
    assert engines["nanovllm"]["load"]["kv_transfer_config"] == OFFLOAD
    assert engines["nanovllm-no-kv-transfer"]["load"]["kv_transfer_config"] is None
    assert engines["nanovllm-no-kv-transfer"]["agreement"]["tokens_pct"] == 100.0
    assert m["prefix"]["agreement"]["tokens_pct"] == 100.0
