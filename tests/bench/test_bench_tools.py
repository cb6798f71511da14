"""The measuring tools of nanovllm/bench/tools/ run, and compare what they say they compare."""

from __future__ import annotations

import pytest
import torch

from nanovllm.bench.tools import block_manager, cpu_attention, cpu_moe, cpu_token_ops
from nanovllm.kernels import cpu_token_ops as token_kernels
from nanovllm.kernels.reference import paged_attention_ref


def test_block_manager_measures_every_operation() -> None:
    costs = block_manager.measure(num_blocks=1000, num_ops=100)
    assert set(costs) == {"allocate_us", "free_us", "hit_alloc_free_us"}
    assert all(v > 0 for v in costs.values())


@pytest.mark.parametrize(
    "case",
    [
        cpu_attention.Case("decodes", (37, 5, 64, 17), (1, 1, 1, 1), 4, 2, 1, 256),
        cpu_attention.Case("chunk + fresh + decode", (48, 20, 9), (16, 20, 1), 4, 2, 1, 256),
    ],
    ids=lambda c: c.label,
)
def test_torch_path_is_the_attention_of_the_reference(case: cpu_attention.Case) -> None:
    # The "vs torch" column divides by the engine's torch path: it must compute attention.
    torch_path = cpu_attention.TorchPath()
    for args in cpu_attention.make_layers(replace_layers(case)):
        torch.testing.assert_close(torch_path(*args), paged_attention_ref(*args))


@pytest.mark.skipif(
    not cpu_attention.cpu_fast_path_available()
    or cpu_attention.cpu_paged_attention_c.load() is None,
    reason="no numba, or the C attention kernel is not built here",
)
def test_the_c_row_is_the_attention_of_the_reference() -> None:
    case = cpu_attention.Case("decodes", (37, 5, 64, 17), (1, 1, 1, 1), 9, 3, 1, 256)
    for args in cpu_attention.make_layers(case):
        torch.testing.assert_close(cpu_attention.c_decode(*args), paged_attention_ref(*args))


def replace_layers(case: cpu_attention.Case) -> cpu_attention.Case:
    """Two layers: the second call reuses the metadata built for the first."""
    return cpu_attention.Case(
        case.label, case.seq_lens, case.q_lens, case.num_heads, case.num_kv_heads, 2, case.hidden
    )


@pytest.mark.skipif(not token_kernels.applies(torch.zeros(1)), reason="numba is not installed")
def test_token_ops_bench_prints_both_ops(capsys: pytest.CaptureFixture[str]) -> None:
    cpu_token_ops.main(["--tokens", "3", "--repeats", "2", "--threads", "1"])
    out = capsys.readouterr().out
    assert "rmsnorm" in out and "rope" in out


def test_moe_bench_times_the_plain_layer_and_both_fast_ways(capsys) -> None:
    cpu_moe.main(["--tokens", "3", "--repeats", "1", "--threads", "1", "--shapes", "tiny"])
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:3] == ["tiny", "(tests)", "3"] and len(row) == 8 and row[-1].endswith("x")


@pytest.mark.slow
def test_gguf_quantized_bench_prints_both_ways(tmp_path, capsys) -> None:
    """The tool re-quantizes a float32 GGUF file to Q8_0 and measures it both ways: the kept
    blocks take about 34/128 of the float32 weights' bytes (norms aside)."""
    pytest.importorskip("gguf")
    from tiny_gguf import write_gguf
    from tiny_models import make_model

    from nanovllm.bench.tools import gguf_quantized

    folder = make_model(tmp_path / "hf", arch="llama", tie=True, seed=1)
    source = write_gguf(folder, tmp_path / "f32.gguf")
    out = tmp_path / "q8.gguf"
    argv = ["--model", str(source), "--requantize", "Q8_0", "--out", str(out)]
    argv += ["--ways", "fp32,quantized"]
    gguf_quantized.main([*argv, "--batch", "2", "--prompt", "4", "--steps", "2", "--threads", "1"])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    fp32, quantized = float(rows["fp32"][2]), float(rows["quantized"][2])  # weight MiB
    assert 0.2 < quantized / fp32 < 0.35
    assert out.is_file()
