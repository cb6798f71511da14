"""`nanovllm bench --speculative-config`: nanovllm speculating against nanovllm-no-spec.

Never asserts a speed. The figures are checked against what they are made of: fake runs with
known steps, times and counts, then one short real run on the embedded model (whose long greedy
outputs repeat, so proposals are made and accepted): the same tokens with and without
speculation, no more steps with it, and acceptance figures that follow from the counts.
"""

from __future__ import annotations

import json

import pytest

from nanovllm.bench import speculation
from nanovllm.bench.records import EngineRun, RequestRecord
from nanovllm.cli import main

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}


def _run(wall_s: float, steps: int, tokens: list[list[int]], spec=(0, 0, 0)) -> EngineRun:
    records = [RequestRecord(ids, [0.1] * len(ids)) for ids in tokens]
    counts = dict(zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), spec))
    return EngineRun("nanovllm", wall_s, records, {"steps": [{}] * steps, "spec": counts})


def test_the_comparison_from_known_runs() -> None:
    same = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]  # 10 output tokens
    with_spec = [_run(1.0, 4, same, (3, 10, 6)), _run(2.0, 4, same, (3, 10, 6))]
    without = [_run(2.0, 10, same), _run(4.0, 10, same), _run(3.0, 10, same)]
    figures = speculation.compare(with_spec, without, greedy=True, config=NGRAM)
    assert figures["with"]["steps"] == 4 and figures["without"]["steps"] == 10
    assert figures["with"]["steps_per_output_token"] == 0.4
    assert figures["with"]["tok_s"]["median"] == 7.5  # 10 and 5 tok/s
    assert figures["without"]["tok_s"]["median"] == pytest.approx(10 / 3)  # 5, 2.5, 3.33
    assert figures["speedup"] == pytest.approx(7.5 / (10 / 3))
    assert figures["steps_ratio"] == 0.4
    # Summed over both speculating runs: 6 verifications of 20 tokens, 12 accepted.
    assert (figures["num_drafts"], figures["num_draft_tokens"]) == (6, 20)
    assert figures["acceptance_rate"] == 0.6
    assert figures["mean_accepted_length"] == 3.0
    assert figures["agreement"]["tokens_pct"] == 100.0
    assert speculation.compare(with_spec, without, greedy=False, config=NGRAM)["agreement"] is None


def test_no_proposals_give_zero_rates_not_errors() -> None:
    runs = [_run(1.0, 3, [[1, 2, 3]])]
    figures = speculation.compare(runs, runs, greedy=True, config=NGRAM)
    assert figures["acceptance_rate"] == 0.0 and figures["mean_accepted_length"] == 0.0


def test_embedded_model_with_and_without_speculation(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--model", "embedded", "--engines", "nanovllm", "--threads", "1"]
    argv += ["--num-requests", "4", "--output-len", "32:48", "--no-extras", "--json", str(out)]
    argv += ["--speculative-config", json.dumps(NGRAM)]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "Speculative decoding (method=ngram" in printed and "acceptance rate" in printed

    (m,) = json.loads(out.read_text())["models"]
    engines, sp = m["engines"], m["speculation"]
    assert engines["nanovllm"]["load"]["speculative_config"] == NGRAM
    assert engines["nanovllm-no-spec"]["load"]["speculative_config"] is None
    asked = m["workload"]["output_tokens"]
    assert sp["with"]["output_tokens"] == sp["without"]["output_tokens"] == asked
    assert sp["agreement"]["tokens_pct"] == 100.0, "speculation changed greedy tokens"
    assert 0 < sp["num_accepted_tokens"] <= sp["num_draft_tokens"] <= 4 * sp["num_drafts"]
    assert sp["acceptance_rate"] == sp["num_accepted_tokens"] / sp["num_draft_tokens"]
    assert sp["mean_accepted_length"] == 1 + sp["num_accepted_tokens"] / sp["num_drafts"]
    assert sp["with"]["steps"] <= sp["without"]["steps"]
    assert sp["with"]["steps_per_output_token"] == sp["with"]["steps"] / asked
    assert engines["nanovllm-no-spec"]["nanovllm_over_this"] == pytest.approx(sp["speedup"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "not JSON"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "'eagle'"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram"}', "num_speculative_tokens"),
    ],
)
def test_bad_speculative_configs_are_named(value, message, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--quick", "--speculative-config", value])
    assert message in capsys.readouterr().err
