"""nanovllm.kernels: the engine's attention kernels, each beside a plain-torch reference.

Paged attention and the KV-cache write are the two operations a paged KV cache adds to a
transformer. Each has a reference in plain torch, written to be obviously correct, and one or two
Triton kernels that are tested against it (on a CPU, through Triton's interpreter):

    reference.py               store_kvcache_ref, paged_attention_ref: the oracles (plain torch)
    store_kvcache.py           store_kvcache: write this step's K/V into the paged cache (Triton)
    paged_attention_naive.py   paged_attention_naive: decode attention, two passes, scores in a
                               scratch buffer - the version to read first (Triton)
    paged_attention.py         paged_attention: online-softmax (FlashAttention-style) attention for
                               decode, prefill and chunked prefill, with GQA and split-KV (Triton)
    cpu_paged_attention.py     paged_attention_cpu: the same attention on a CPU, reading K/V in
                               place (numba kernel in cpu_paged_attention_numba.py; falls back to
                               the reference, with one notice, where numba is missing)
    cpu_token_ops.py           RMSNorm and RoPE on a CPU in one numba loop each (kernels in
                               cpu_token_ops_numba.py); the model's own torch code is their
                               reference, and runs wherever they do not apply
    triton_setup.py            the one place that picks Triton's CPU interpreter or GPU compiler
    checks.py                  argument checks shared by the wrappers (which shapes are served)
    compile_check.py           python -m nanovllm.kernels.compile_check: compile every kernel for
                               sm_80/sm_90 without a GPU

Their benchmarks live beside the bench, in nanovllm/bench/tools/ (cpu_attention.py,
cpu_token_ops.py, triton_kernels.py).

The paged KV cache of one layer is a pair of tensors
`[num_blocks, block_size, num_kv_heads, head_dim]`; token slot = block_id * block_size + offset.

This package imports no Triton or numba by itself (Triton only ships for Linux x86_64, and the
engine must import this package anywhere). Import the kernels from their modules when you need them:

    from nanovllm.kernels.paged_attention import paged_attention
    from nanovllm.kernels.store_kvcache import store_kvcache
    from nanovllm.kernels.cpu_paged_attention import paged_attention_cpu

"""

from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref

__all__ = ["paged_attention_ref", "store_kvcache_ref"]
