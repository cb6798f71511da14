"""`nanovllm bench --tensor-parallel-size 2`: nanovllm over two gloo ranks against nanovllm-tp1.

The oracle is the one-process engine: sharding changes where the arithmetic runs, not the
greedy tokens, so the bench's agreement between the two must be total.
"""

import json

from nanovllm.cli import main


def test_two_ranks_against_one(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--model", "embedded", "--engines", "nanovllm", "--threads", "2"]
    argv += ["--num-requests", "4", "--output-len", "8:16", "--no-extras", "--json", str(out)]
    argv += ["--tensor-parallel-size", "2"]
    assert main(argv) == 0
    capsys.readouterr()

    (m,) = json.loads(out.read_text())["models"]
    engines = m["engines"]
    assert engines["nanovllm"]["load"]["tensor_parallel_size"] == 2
    assert engines["nanovllm-tp1"]["load"]["tensor_parallel_size"] == 1
    tp1 = engines["nanovllm-tp1"]
    assert tp1["agreement"]["tokens_pct"] == 100.0, "two ranks changed greedy tokens"
    assert tp1["nanovllm_over_this"] > 0
