"""The numba RMSNorm, RoPE, SiLU-and-multiply and residual add + RMSNorm (kernels/cpu_token_ops.py,
the CPU backend's `NumbaRMSNorm`, `NumbaRotaryEmbedding` and `NumbaDecoderLayer`) against the
model's own torch code.

The reference is the same module run through its plain class's `forward` (`RMSNorm`,
`RotaryEmbedding`), so what is compared is exactly the torch code the plain model runs. Inputs are random,
with random norm weights, odd sizes, tokens at any position of the table, and q/k as the strided
views of a fused QKV output that the model hands in.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm.backends.cpu import NumbaRMSNorm, NumbaRotaryEmbedding
from nanovllm.kernels import cpu_token_ops
from nanovllm.models.layernorm import RMSNorm
from nanovllm.models.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    cpu_token_ops._numba_kernels() is None, reason="numba is not installed: no kernels to test"
)


def reference(module: torch.nn.Module, *args):
    """The module's torch code: the plain layer's `forward` (the numba class's parent)."""
    plain = RMSNorm if isinstance(module, RMSNorm) else RotaryEmbedding
    return plain.forward(module, *args)


@settings(max_examples=examples(30), deadline=None)
@given(
    num_tokens=st.integers(1, 70),
    hidden=st.sampled_from([1, 7, 64, 256, 300]),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    seed=st.integers(0, 2**16),
    extra_dim=st.booleans(),
)
def test_rms_norm_equals_the_torch_code(num_tokens, hidden, eps, seed, extra_dim) -> None:
    gen = torch.Generator().manual_seed(seed)
    norm = NumbaRMSNorm(hidden, eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=gen))
    shape = (num_tokens, 2, hidden) if extra_dim else (num_tokens, hidden)
    x = torch.randn(shape, generator=gen) * 3
    with torch.inference_mode():
        got = norm(x)
        want = reference(norm, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rms_norm_of_a_strided_view_runs_the_torch_code(monkeypatch) -> None:
    norm = NumbaRMSNorm(8, 1e-5)
    x = torch.randn(5, 16)[:, ::2]  # not contiguous
    calls = []
    kernel = cpu_token_ops._numba_kernels().rms_norm
    monkeypatch.setattr(
        cpu_token_ops._numba_kernels(), "rms_norm", lambda *a: calls.append(a) or kernel(*a)
    )
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), reference(norm, x))
        assert not calls
        norm(x.contiguous())
    assert len(calls) == 1


@settings(max_examples=examples(20), deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    d=st.sampled_from([1, 7, 64, 300]),
    magnitude=st.sampled_from([0.0, 1.0, 10.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_silu_and_mul_equals_the_mlps_torch_code(num_tokens, d, magnitude, seed) -> None:
    """vLLM's `SiluAndMul` as `MLP.forward` writes it: `F.silu(gate) * up` on the two halves of
    the fused gate/up output; gates up to +-100 reach the exp's clamp at -87."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, 2 * d, generator=gen) * magnitude
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(
        cpu_token_ops.silu_and_mul(x), F.silu(gate) * up, rtol=1e-5, atol=1e-6
    )


@settings(max_examples=examples(20), deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    hidden=st.sampled_from([1, 7, 64, 300]),
    eps=st.sampled_from([1e-6, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_fused_add_rms_norm_equals_the_add_then_the_norm(num_tokens, hidden, eps, seed) -> None:
    """`DecoderLayer.forward`'s `x + attention(...)` then `post_attention_layernorm`: the sum
    bit for bit (one float addition either way), the norm to rounding."""
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(hidden, eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=gen))
    x, residual = (torch.randn(num_tokens, hidden, generator=gen) * 3 for _ in range(2))
    with torch.inference_mode():
        want_sum = residual + x
        want = norm(want_sum)
        got = cpu_token_ops.fused_add_rms_norm(x, residual, norm.weight, eps)
    assert torch.equal(residual, want_sum)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=examples(30), deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    heads=st.sampled_from([(1, 1), (4, 2), (12, 4), (3, 1)]),
    head_dim=st.sampled_from([2, 8, 64, 128]),
    rope=st.sampled_from(
        [
            {"rope_theta": 10000.0},
            {"rope_theta": 500000.0},
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ]
    ),
    seed=st.integers(0, 2**16),
)
def test_rotary_equals_the_torch_code(num_tokens, heads, head_dim, rope, seed) -> None:
    num_heads, num_kv_heads = heads
    max_position = 300
    gen = torch.Generator().manual_seed(seed)
    rotary = NumbaRotaryEmbedding(head_dim, max_position, rope)
    # q and k as the model has them: strided views into one fused projection output.
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(num_tokens, num_heads, head_dim)
    k = k.view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, max_position, (num_tokens,), generator=gen)
    with torch.inference_mode():
        got_q, got_k = rotary(positions, q, k)
        want_q, want_k = reference(rotary, positions, q, k)
    assert got_q.is_contiguous() and got_k.is_contiguous()
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv[:, :q_size].view(num_tokens, num_heads, head_dim), q)  # unchanged


@pytest.mark.parametrize("bad", [-1, 300, 10**6])
def test_a_position_outside_the_tables_is_named(bad: int) -> None:
    rotary = NumbaRotaryEmbedding(8, 300, {"rope_theta": 10000.0})
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    with pytest.raises(ValueError, match=f"token 1 is at position {bad}, outside"):
        rotary(torch.tensor([5, bad, 7]), q, k)


def test_the_kernels_leave_what_they_do_not_serve_to_torch() -> None:
    x = torch.randn(3, 4)
    assert cpu_token_ops.applies(x)
    assert not cpu_token_ops.applies(x.to(torch.bfloat16))
    assert not cpu_token_ops.applies(x.double())


@pytest.mark.parametrize("backend, uses_kernels", [("torch", False), ("cpu", True)])
def test_the_plain_torch_model_runs_no_kernel(tiny_llama, backend, uses_kernels, monkeypatch):
    from nanovllm import LLM, SamplingParams

    kernels = cpu_token_ops._numba_kernels()
    calls = []
    names = ("rms_norm", "rotary", "rotary_and_store_kv", "fused_add_rms_norm", "silu_and_mul")
    for name in names:
        kernel = getattr(kernels, name)
        monkeypatch.setattr(
            kernels, name, lambda *a, name=name, kernel=kernel: calls.append(name) or kernel(*a)
        )
    llm = LLM(str(tiny_llama), attention_backend=backend)
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert bool(calls) == uses_kernels
    if uses_kernels:
        # (A Llama's RoPE runs inside the fused split-RoPE-KV-write loop: `NumbaAttention`;
        # its decoder layers' residual add + norm and SwiGLU in `NumbaDecoderLayer`'s loops.)
        assert set(calls) == {
            "rms_norm",
            "rotary_and_store_kv",
            "fused_add_rms_norm",
            "silu_and_mul",
        }


@settings(max_examples=examples(30), deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    heads=st.sampled_from([(1, 1), (4, 2), (9, 3), (3, 1)]),
    head_dim=st.sampled_from([2, 8, 64]),
    block_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_rotary_and_kv_write_equal_the_plain_split_rope_and_store_kv(
    num_tokens, heads, head_dim, block_size, seed
) -> None:
    """`rotary_and_store_kv` (what `NumbaAttention` runs) against the plain attention layer's
    own code on the same fused QKV output: `Attention.qkv`'s split and `RotaryEmbedding.forward`,
    then `store_kv`; the cache slots the step does not write must stay as they were."""
    from nanovllm.models.attention import store_kv

    num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    rotary = RotaryEmbedding(head_dim, 300, {"rope_theta": 10000.0})
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen)
    positions = torch.randint(0, 300, (num_tokens,), generator=gen)
    num_blocks = -(-num_tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    caches = [torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)]
    caches.append(torch.randn(caches[0].shape, generator=gen))
    want_k_cache, want_v_cache = (c.clone() for c in caches)
    with torch.inference_mode():
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        want_q, want_k = rotary(
            positions,
            q.view(num_tokens, num_heads, head_dim),
            k.view(num_tokens, num_kv_heads, head_dim),
        )
        store_kv(
            want_k,
            v.reshape(num_tokens, num_kv_heads, head_dim),
            *(want_k_cache, want_v_cache),
            slots,
        )
        got_q = cpu_token_ops.rotary_and_store_kv(
            qkv, num_heads, positions, rotary.cos_cached, rotary.sin_cached, *caches, slots
        )
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0], want_k_cache, rtol=1e-5, atol=1e-5)
    assert torch.equal(caches[1], want_v_cache)  # values are copied, not computed


@pytest.mark.parametrize("position, slot", [(300, 0), (-1, 0), (0, 64), (0, -1)])
def test_a_position_or_slot_outside_the_tables_is_named_before_a_write(position, slot) -> None:
    rotary = RotaryEmbedding(8, 300, {"rope_theta": 10000.0})
    caches = [torch.zeros(4, 16, 1, 8), torch.zeros(4, 16, 1, 8)]
    with pytest.raises(ValueError, match=f"position {position} with slot {slot}"):
        cpu_token_ops.rotary_and_store_kv(
            torch.ones(1, 24),
            1,
            torch.tensor([position]),
            rotary.cos_cached,
            rotary.sin_cached,
            *caches,
            torch.tensor([slot]),
        )
    assert not caches[0].any() and not caches[1].any()
