"""`nanovllm bench`: nanovllm side by side with its peers, on one workload, in one run.

How every number is made, and how to read the table: README.md in this folder. The pieces, one
idea per file, in the order a run uses them:

    workload.py         the requests: lengths, token ids, arrivals, each from its own seed
    models.py           which checkpoint: the embedded model, a random Llama, or a folder
    roofline.py         this machine's matmul rate and copy bandwidth; the workload's floor
    engines.py          the plug-in interface every engine keeps, and the registry by name
    steploop.py         the arrival-and-step loop that times nanovllm and vLLM alike
    engine_nanovllm.py  nanovllm, every step measured
    engine_hf.py        transformers: static batches, one at a time, continuous batching
    engine_vllm.py      vLLM, in its own virtualenv, through vllm_worker.py
    records.py, stats.py  what a run returns; percentiles, latency, greedy agreement
    analysis.py         nanovllm's steps: overhead breakdown, paged vs contiguous KV memory
    speculation.py      --speculative-config: nanovllm with speculative decoding vs without
    profile_step.py     --profile: cProfile of nanovllm's step
    suite.py            the run: load, warm up, interleaved repeats, nanovllm's extra figures
    report.py, plot.py, cli.py   tables and JSON, the --plot figure, the command line
    tools/              the measuring tools: one piece of the engine at a time (its __init__)
"""
