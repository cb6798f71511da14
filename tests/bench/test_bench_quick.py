"""`nanovllm bench --quick` end to end on a micro model: table, JSON and plot.

Never asserts a timing: a shared CI machine makes any speed figure noise. It checks that every
engine ran the same workload and produced exactly the tokens each request asked for, that the
figures are present and sane, and that a missing vLLM is skipped with a reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanovllm.bench.engine_base import EngineUnavailable
from nanovllm.bench.engine_vllm import VLLMEngine
from nanovllm.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[dict, Path, str]:
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--quick", "--threads", "1", "--json", str(out / "bench.json")]
    argv += ["--plot", str(out / "bench.png"), "--profile"]
    argv += ["--engines", "nanovllm,hf-static,hf-cb,one-at-a-time,vllm"]
    argv += ["--vllm-python", str(out / "no-such-python")]
    return argv, out


def test_quick_run(quick, capsys) -> None:
    argv, out = quick
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Throughput and latency" in printed and "Targets" in printed
    assert (out / "bench.png").stat().st_size > 10_000

    result = json.loads((out / "bench.json").read_text())
    (model,) = result["models"]
    asked = model["workload"]["output_tokens"]
    engines = model["engines"]
    for name in ("nanovllm", "hf-static", "hf-cb", "one-at-a-time"):
        e = engines[name]
        assert [r["output_tokens"] for r in e["runs"]] == [asked], name
        assert e["tok_s"]["median"] > 0
        assert e["latency"]["ttft"]["p50"] >= 0
        assert 0 <= e["agreement"]["tokens_pct"] <= 100
    assert engines["nanovllm"]["agreement"]["tokens_pct"] == 100.0
    assert "no-such-python" in engines["vllm"]["skipped"]
    assert engines["hf-static"]["load"]["batch_size"] in (4, 8)

    mem = model["memory"]
    assert 0 <= mem["fragmentation_time_weighted"] < 1
    assert mem["fit_paged"] >= mem["fit_contiguous"] > 0
    prefix = model["prefix"]
    assert prefix["computed_with_cache"] < prefix["computed_without_cache"]
    assert prefix["computed_without_cache"] >= prefix["prompt_tokens"]
    shares = model["overhead"]["all_steps"]["share"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert model["floor"]["seconds"] > 0
    assert model["profile"]["top"]
    assert {t["target"] for t in model["targets"]} >= {"internal fragmentation"}


def test_missing_vllm_is_unavailable(tmp_path) -> None:
    engine = VLLMEngine(str(tmp_path), python=str(tmp_path / "nope"))
    with pytest.raises(EngineUnavailable, match="does not exist"):
        engine.load()
    engine.close()
