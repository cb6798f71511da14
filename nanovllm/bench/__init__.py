"""`nanovllm bench`: throughput, latency and KV memory, nanovllm side by side with its peers.

One run gives every engine the same requests (token ids and lengths), the same weights and the
same thread count, and reports output tokens/s, TTFT and inter-token latency, greedy agreement,
KV fragmentation against contiguous reservation, prefix-cache savings, engine overhead and a
linear-layer floor. The pieces, one idea per file:

    workload.py      the requests: lengths and token ids from separate seeded generators
    records.py       what an engine run returns (per-request token ids and token times)
    stats.py         percentiles, throughput, latency and agreement from records
    memory.py        paged vs contiguous KV arithmetic (fragmentation, requests that fit)
    models.py        which checkpoint: the embedded model, a tiny or a ~100M random Llama
    engine_*.py      one adapter per engine (engine_base.py: their contract): nanovllm,
                     transformers static batches (and one at a time), transformers'
                     continuous batching, vLLM (in its own venv, as a subprocess,
                     through vllm_worker.py)
    analysis.py      step breakdown, memory figures and targets from nanovllm's steps
    floor.py         the model's linear layers alone for nanovllm's step shapes
    profile_step.py  cProfile of nanovllm's step at full concurrency
    suite.py         runs it all: load, warm up, interleaved repeats, extra experiments
    report.py        the rich tables and the JSON document
    plot.py          the --plot figure
    cli.py           the command line
"""
