"""The `llamacpp-bench` engine (llama.cpp's own llama-batched-bench): the parser on the real
tool's recorded output, the whole plug-in against a fake tool, and the workloads it refuses."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from nanovllm.bench import engine_llamacpp_bench as lb
from nanovllm.bench.engines import EngineLimits, EngineUnavailable, make_engine
from nanovllm.bench.workload import random_workload, with_poisson_arrivals

# The real tool's standard output for `-npp 16 -ntg 8 -npl 4 --output-format jsonl` on
# SmolLM2-135M Q8_0 (the llama.cpp that llama-cpp-python 0.3.36 vendors).
RECORDED = Path(__file__).parent / "data" / "llama_batched_bench_jsonl.txt"


def test_the_parser_reads_the_real_tools_output() -> None:
    row = lb.parse_output(RECORDED.read_text(), (16, 8, 4))
    # the tool's own rates follow from its times (its figures, rounded, checked against each other)
    assert row["speed_pp"] == pytest.approx(4 * 16 / row["t_pp"], rel=1e-5)
    assert row["speed_tg"] == pytest.approx(4 * 8 / row["t_tg"], rel=1e-5)
    assert row["t"] == pytest.approx(row["t_pp"] + row["t_tg"], rel=1e-5)
    with pytest.raises(EngineUnavailable, match="no result for -npp 16 -ntg 8 -npl 32"):
        lb.parse_output(RECORDED.read_text(), (16, 8, 32))  # (a shape it skipped)


# A stand-in for llama-batched-bench: checks its command line, records its environment's wait
# policy, prints a log line and one JSON line whose times follow from the shape.
FAKE_TOOL = """
import json, os, sys
a = sys.argv[1:]
arg = lambda name: a[a.index(name) + 1]
pp, tg, pl = int(arg("-npp")), int(arg("-ntg")), int(arg("-npl"))
assert int(arg("-c")) == pl * (pp + tg) and arg("-t") == arg("-tb") == "2", a
assert arg("--output-format") == "jsonl" and arg("-m").endswith("model.gguf"), a
if pl == 7:
    sys.exit("error: failed to decode the batch")
print("llama_batched_bench: n_kv_max = 1024")
t_pp, t_tg = pp * pl / 1000, tg * pl / 100
print(json.dumps({"pp": pp, "tg": tg, "pl": pl, "t_pp": t_pp, "t_tg": t_tg, "t": t_pp + t_tg}))
"""


def test_the_plugin_against_a_fake_tool(tmp_path, monkeypatch) -> None:
    tool = tmp_path / "llama-batched-bench"
    tool.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_TOOL))
    tool.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("LLAMACPP_BIN_DIR", str(tmp_path))
    engine = make_engine("llamacpp-bench", str(model), EngineLimits(threads=2, max_num_seqs=8))
    info = engine.load()
    assert "no token ids" in info["configuration"]
    workload = random_workload(5, (6, 6), (4, 4), 1000)
    run = engine.run(workload)
    t_pp, t_tg = 6 * 5 / 1000, 4 * 5 / 100
    assert run.engine == "llamacpp-bench" and run.wall_s == pytest.approx(t_pp + t_tg)
    assert run.num_output_tokens == workload.num_output_tokens
    for rec in run.records:
        assert rec.token_ids == [lb.NO_TOKEN] * 4
        assert rec.token_times == pytest.approx([t_pp + t_tg * k / 3 for k in range(4)])
    one_token = engine.run(random_workload(2, (3, 3), (1, 1), 1000))
    assert [r.token_times for r in one_token.records] == [[pytest.approx(one_token.wall_s)]] * 2
    with pytest.raises(EngineUnavailable, match="exited with 1: error: failed to decode"):
        engine.run(random_workload(7, (3, 3), (2, 2), 1000))


def test_it_refuses_what_the_tool_cannot_run(tmp_path, monkeypatch) -> None:
    uniform = random_workload(4, (8, 8), (3, 3), 1000)
    assert lb.bench_shape(uniform, max_num_seqs=4) == (8, 3, 4)
    with pytest.raises(EngineUnavailable, match="one prompt length and one output length"):
        lb.bench_shape(random_workload(4, (8, 9), (3, 3), 1000, seed=2), max_num_seqs=4)
    with pytest.raises(EngineUnavailable, match="offline workloads only"):
        lb.bench_shape(with_poisson_arrivals(uniform, rate=10.0), max_num_seqs=4)
    with pytest.raises(EngineUnavailable, match="all 4 requests at once, over --max-num-seqs 3"):
        lb.bench_shape(uniform, max_num_seqs=3)
    monkeypatch.setenv("LLAMACPP_BIN_DIR", str(tmp_path))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(EngineUnavailable, match=f"no {tmp_path}/llama-batched-bench; build it"):
        make_engine("llamacpp-bench", str(model), EngineLimits()).load()
    with pytest.raises(EngineUnavailable, match="GGUF files only"):
        make_engine("llamacpp-bench", str(tmp_path), EngineLimits()).load()
    assert json.loads(RECORDED.read_text().splitlines()[0])["pl"] == 4  # (the fixture's shape)
