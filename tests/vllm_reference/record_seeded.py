"""Record the tokens vLLM's CPU build draws for seeded requests, as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_seeded.py \\
        nanovllm/default_model tests/vllm_reference/seeded_embedded.json

It reads the cases (prompt token ids, sampling params, max_tokens) from the JSON file, runs them
through vLLM in one batch, float32, and writes each case's `vllm_token_ids` (one list per
completion) and vLLM's version back into the file. `tests/test_seeded_like_vllm.py` checks that
nanovllm draws the same tokens.
"""

import json
import sys


def main() -> None:
    import vllm
    from vllm import LLM, SamplingParams

    model, path = sys.argv[1], sys.argv[2]
    doc = json.load(open(path))
    llm = LLM(
        model=model,
        dtype="float32",
        skip_tokenizer_init=True,
        seed=0,
        enforce_eager=True,
        block_size=32,  # vLLM's CPU attention: multiples of 32
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
    )
    cases = doc["cases"]
    prompts = [{"prompt_token_ids": c["prompt"]} for c in cases]
    params = [
        SamplingParams(max_tokens=c["max_tokens"], detokenize=False, **c["params"]) for c in cases
    ]
    for case, out in zip(cases, llm.generate(prompts, params)):
        case["vllm_token_ids"] = [list(o.token_ids) for o in out.outputs]
    doc["vllm"] = f"vllm {vllm.__version__}"
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process
    main()
