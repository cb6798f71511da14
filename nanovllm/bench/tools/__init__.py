"""The measuring tools beside the bench: each times one piece of the engine on its own.

    block_manager.py    `nanovllm microbench`: the KV cache manager's cost per allocate, free and
                        cache hit, from 10^3 to 10^6 blocks
    stress.py           `nanovllm stress`: step time under a long queue; a soak run with aborts
    tensor_parallel.py  python -m nanovllm.bench.tools.tensor_parallel: messages between ranks,
                        fused against separate projections, sliced against full loading
    cpu_attention.py    python -m nanovllm.bench.tools.cpu_attention [--quick] [--threads N]:
                        the numba paged attention against the engine's torch path
    cpu_token_ops.py    python -m nanovllm.bench.tools.cpu_token_ops: RMSNorm and RoPE, the
                        model's torch code against the numba kernels
    triton_kernels.py   python -m nanovllm.bench.tools.triton_kernels [--quick]: the Triton
                        kernels against torch SDPA and the copy bandwidth (on a CPU, through
                        Triton's interpreter)

Each prints its figures and asserts none; kernels/README.md and nanovllm/bench/README.md quote
them.
"""
