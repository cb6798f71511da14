"""`nanovllm bench --quick` end to end on a micro model: tables, JSON and plot.

Never asserts a speed: on a shared CI machine any timing is noise. It checks that every engine
ran the same workload and produced exactly the tokens each request asked for, that nanovllm's
greedy tokens equal transformers' one request at a time, that the figures hang together, and
that a missing vLLM is skipped with its reason.
"""

from __future__ import annotations

import json

import pytest

from nanovllm.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--quick", "--threads", "1", "--json", str(out / "bench.json"), "--profile"]
    argv += ["--plot", str(out / "bench.png"), "--vllm-python", str(out / "no-such-python")]
    argv += ["--engines", "nanovllm,hf-static,hf-cb,one-at-a-time,vllm"]
    return argv, out


@pytest.mark.quick
def test_quick_run(quick, capsys) -> None:
    argv, out = quick
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for text in (
        "8 requests, prompts 8-32, outputs 8-16",
        "nanovllm / this",
        "repeat by repeat",
        "Roofline",
    ):
        assert text in printed
    assert (out / "bench.png").stat().st_size > 10_000

    (m,) = json.loads((out / "bench.json").read_text())["models"]
    w, r, engines = m["workload"], m["roofline"], m["engines"]
    for name in ("nanovllm", "hf-static", "hf-cb", "one-at-a-time"):
        e = engines[name]
        assert [run["output_tokens"] for run in e["runs"]] == [w["output_tokens"]], name
        assert e["roofline_share"] == pytest.approx(e["tok_s"]["median"] / r["ceiling_tok_s"])
        assert e["nanovllm_over_this"] == pytest.approx(
            engines["nanovllm"]["tok_s"]["median"] / e["tok_s"]["median"]
        )
    assert engines["one-at-a-time"]["agreement"]["tokens_pct"] == 100.0  # no padding: exact
    assert "no-such-python" in engines["vllm"]["skipped"]
    assert engines["hf-static"]["batch_size"] in (4, 8)

    # The roofline counts every prompt token and all outputs but each request's last.
    assert r["forwarded_tokens"] == w["prompt_tokens"] + w["output_tokens"] - 8
    assert r["floor_s"] == pytest.approx(r["compute_s"] + r["memory_s"])
    assert r["ceiling_tok_s"] == pytest.approx(w["output_tokens"] / r["floor_s"])
    assert set(r["matmul_flops_by_rows"]) == {"8", "256"}  # the decode batch, a prefill chunk

    mem = m["memory"]
    assert 0 <= mem["fragmentation"] < 1 and mem["fit_paged"] >= mem["fit_contiguous"] > 0
    assert mem["peak_allocated_slots"] >= mem["peak_filled_slots"] > 0
    prefix = m["prefix"]
    assert prefix["computed_with_cache"] < prefix["computed_without_cache"]
    assert prefix["computed_without_cache"] >= prefix["prompt_tokens"]
    assert prefix["agreement"]["tokens_pct"] == 100.0
    assert sum(m["overhead"]["all_steps"]["share"].values()) == pytest.approx(1.0)
    assert m["profile"]["top"]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--engines", "nanovllm,bogus", "bogus"),
        ("--prompt-len", "9:3", "9:3"),
        ("--repeats", "0", "0"),
    ],
)
def test_bad_flags_are_named(flag, value, message, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--quick", flag, value])
    assert message in capsys.readouterr().err
