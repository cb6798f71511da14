"""The CPU's prepacked linear layers (`nanovllm/backends/cpu_linear.py`) against `F.linear`.

Oracles: `F.linear` on the same weight for single products, through either library's packing
(MKL's made for `MKL_PACK_ROWS` rows, used at any row count); the same model's forward pass
with its packed copies dropped (`unpack_linear_weights`) for a whole checkpoint; and the CPU
backend's layer classes (`packed_layers`) against the plain ones they extend.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm import LLM, SamplingParams
from nanovllm.backends import cpu_linear
from nanovllm.backends.cpu_linear import (
    MKL_PACK_ROWS,
    PackedMatmul,
    can_prepack,
    linear,
    linear_layers,
    pack_weight,
    prepack_linear_weights,
    unpack_linear_weights,
)
from nanovllm.kernels import cpu_linear_c

# The libraries this machine can pack for: oneDNN always (else the module is skipped), MKL where
# its packing passes the engine's check, our C panels kernel where it builds (AVX-512).
LIBRARIES = (
    ["onednn"]
    + (["mkl"] if cpu_linear.mkl_packs_for_any_rows() else [])
    + (["c"] if cpu_linear_c.load() is not None else [])
)

pytestmark = pytest.mark.skipif(
    not can_prepack(torch.zeros(1, 1)), reason="this torch has no oneDNN on the CPU"
)


@pytest.mark.parametrize("library", LIBRARIES)
@settings(max_examples=examples(25), deadline=None)
@given(
    # Around and past the rows MKL packs for too: the engine uses one packing at every count.
    rows=st.one_of(st.integers(1, 70), st.integers(MKL_PACK_ROWS - 2, MKL_PACK_ROWS + 40)),
    in_features=st.integers(1, 96),
    out_features=st.integers(1, 130),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_product_equals_f_linear(
    library, rows, in_features, out_features, bias, seed
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g)  # [num_tokens, in]
    w = torch.randn(out_features, in_features, generator=g)  # [out, in]
    b = torch.randn(out_features, generator=g) if bias else None
    packed = pack_weight(w, library)
    assert packed.library == library
    expected = F.linear(x, w, b)
    got = linear(x, w, b, packed)
    assert got.shape == expected.shape == (rows, out_features)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif("mkl" not in LIBRARIES, reason="this torch cannot pack for MKL")
def test_one_mkl_packing_serves_every_row_count_of_a_decode_and_prefill() -> None:
    """The engine's packing (one per weight) against `F.linear` at every row count from one
    decode row to past the rows it was packed for, on a weight of a real model's width."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(192, 576, generator=g)  # [out, in]
    b = torch.randn(192, generator=g)
    packed = pack_weight(w, "mkl")
    for rows in range(0, MKL_PACK_ROWS + 70):
        x = torch.randn(rows, 576, generator=g)
        torch.testing.assert_close(linear(x, w, b, packed), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif("mkl" not in LIBRARIES, reason="this torch cannot pack for MKL")
def test_the_mkl_check_refuses_a_product_that_is_wrong(monkeypatch) -> None:
    """The check the engine runs before packing for MKL: a wrong product (as an MKL whose
    packing served only its own row count might give) sends the engine to oneDNN."""
    real = torch.ops.mkl._mkl_linear
    assert cpu_linear.mkl_packs_for_any_rows.__wrapped__()

    def wrong_past_the_first_row(x, packed, weight, bias, rows):
        y = real(x, packed, weight, bias, rows)
        y[1:] += 1e-3  # one row right, the others off
        return y

    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", wrong_past_the_first_row)
    assert not cpu_linear.mkl_packs_for_any_rows.__wrapped__()
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(cpu_linear, "mkl_packs_for_any_rows", lambda: False)
    assert cpu_linear.packing_library() == "onednn"


@pytest.mark.parametrize(
    "vendor,mkl_passes,library",
    [
        ("GenuineIntel", True, "mkl"),
        ("GenuineIntel", False, "onednn"),
        ("AuthenticAMD", True, "onednn"),  # MKL's fast kernels are Intel's only
        ("", True, "onednn"),  # (no /proc/cpuinfo: not known to be Intel)
    ],
)
def test_mkl_packs_only_on_an_intel_cpu(vendor, mkl_passes, library, monkeypatch) -> None:
    monkeypatch.setattr(cpu_linear_c, "load", lambda: None)  # (the C kernel: tested below)
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(cpu_linear, "mkl_packs_for_any_rows", lambda: mkl_passes)
    assert cpu_linear.packing_library() == library


@pytest.mark.parametrize(
    "vendor,builds,library",
    [
        ("AuthenticAMD", True, "c"),
        ("AuthenticAMD", False, "onednn"),  # no AVX-512 or no compiler: as before
        ("", True, "c"),
        ("GenuineIntel", True, None),  # not measured on Intel: MKL or oneDNN stay
    ],
)
def test_the_c_kernel_packs_where_it_builds_on_a_cpu_that_is_not_intels(
    vendor, builds, library, monkeypatch
) -> None:
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(cpu_linear_c, "load", lambda: object() if builds else None)
    monkeypatch.setattr(cpu_linear, "mkl_packs_for_any_rows", lambda: False)
    assert cpu_linear.packing_library() == (library or "onednn")


def test_the_vendor_is_read_from_proc_cpuinfo() -> None:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        assert cpu_linear.cpu_vendor() == ""
        return
    vendors = [line.split(":", 1)[1].strip() for line in text.splitlines() if "vendor_id" in line]
    assert cpu_linear.cpu_vendor() == (vendors[0] if vendors else "")


def test_only_float32_cpu_weights_are_packed() -> None:
    assert can_prepack(torch.zeros(4, 4))
    assert not can_prepack(torch.zeros(4, 4, dtype=torch.bfloat16))
    assert not can_prepack(torch.zeros(4))


def test_a_loaded_model_is_packed_and_agrees_with_its_plain_weights(tiny_llama) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    layers = linear_layers(model)
    # q/k/v, o, gate/up and down in each of 2 layers, and the LM head.
    assert len(layers) == 4 * 2 + 1
    assert all(isinstance(layer, PackedMatmul) for layer in layers)
    assert all(layer.packed_weight is not None for layer in layers)

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    prompts = [{"prompt_token_ids": [5, 17, 3, 99, 42, 7]}, {"prompt_token_ids": [8, 1, 60]}]

    def run() -> list:
        return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]

    packed = run()
    unpack_linear_weights(model)
    assert all(layer.packed_weight is None for layer in layers)  # F.linear from now on
    plain = run()
    for a, b in zip(packed, plain, strict=True):
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.keys() == lb.keys()
            for token, entry in la.items():
                assert entry.logprob == pytest.approx(lb[token].logprob, abs=1e-4)
    assert prepack_linear_weights(model) == len(layers)


def test_a_packing_failure_falls_back_to_f_linear_with_one_notice(tiny_llama, monkeypatch) -> None:
    llm = LLM(str(tiny_llama), dtype="float32")
    model = llm.llm_engine.runner.model

    def cannot_pack(weight, library):
        raise RuntimeError(f"no {library} kernel for this machine")

    monkeypatch.setattr(cpu_linear, "pack_weight", cannot_pack)
    with pytest.warns(UserWarning, match="could not prepack") as notices:
        assert prepack_linear_weights(model) == 0
    assert len(notices) == 1
    assert all(layer.packed_weight is None for layer in linear_layers(model))


def test_the_backend_builds_packed_subclasses_of_the_engines_layers_only() -> None:
    """Each packed class extends the plain class it replaces (same parameters); a class that
    is not the engine's own (a lesson's) is left as it is."""
    from nanovllm.backends.cpu_linear import CompiledPackedMatmul, packed_layers
    from nanovllm.models.linear import RowParallelLinear
    from nanovllm.models.model_layers import ModelLayers

    class LessonRow(RowParallelLinear):
        pass

    plain = ModelLayers(row=LessonRow)
    for for_compile, mixin in ((False, PackedMatmul), (True, CompiledPackedMatmul)):
        fast = packed_layers(plain, for_compile)
        assert fast.row is LessonRow and fast.attention is plain.attention
        for name in ("qkv", "merged_column", "lm_head"):
            got, base = getattr(fast, name), getattr(plain, name)
            assert got is not base and issubclass(got, base) and issubclass(got, mixin)
    with torch.device("meta"):
        a, b = plain.qkv(16, 4, 4, 2, bias=True), packed_layers(plain).qkv(16, 4, 4, 2, bias=True)
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        k: v.shape for k, v in b.state_dict().items()
    }


def test_the_packing_benchmark_prints_every_way_side_by_side(capsys, monkeypatch) -> None:
    from nanovllm.bench.tools import cpu_linear as tool

    monkeypatch.setattr("sys.argv", ["cpu_linear", "--rows", "3", "--layers", "1"])
    tool.main()
    out = capsys.readouterr().out
    header, row = out.splitlines()[-2:]
    ways = (
        ["F.linear", "oneDNN"]
        + ["MKL, packed for 256", "MKL, packed for 1"] * ("mkl" in LIBRARIES)
        + ["C panels"] * ("c" in LIBRARIES)
    )
    assert all(way in header for way in ways)
    # One cell per way: milliseconds and the speed-up over oneDNN's (itself 1.00x).
    assert row.split()[0] == "3" and row.count("x)") == len(ways) and "(1.00x)" in row
