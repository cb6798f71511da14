"""Record vLLM's offline `LLM.generate` answers to the prompt-truncation cases, as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_offline.py \\
        nanovllm/default_model tests/vllm_reference/offline_issue60.json

(`VLLM_HIDE_TORCHVISION=1` in front where the virtualenv's torchvision does not match its
torch, as for record_serve.py.)

As record_seeded.py does, it builds one `LLM` (float32, the same engine flags) and runs the
file's cases, but with the tokenizer loaded: vLLM cuts a prompt on its tokenizer's truncation
side, "left" for a generating model (without a tokenizer it would keep the first tokens). Each
case is one `generate(prompt, SamplingParams(**params), tokenization_kwargs=...)` call
(`"sampling_params"` cases build `SamplingParams(**params)` alone); its answer is written into
the case as `vllm`: the prompt's token ids and text and the output's token ids, or the error's
class (and whether it is a ValueError) and message. `tests/test_seeded_like_vllm.py` checks that
nanovllm answers the same.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def hide_torchvision() -> None:
    """A vLLM virtualenv whose torchvision does not match its torch fails on import (and vLLM's
    engine process re-imports it): a sitecustomize that marks them missing, for both."""
    hide = tempfile.mkdtemp(prefix="vllm-hide-")
    Path(hide, "sitecustomize.py").write_text(
        "import sys\n"
        "for _n in ('torchvision', 'torchaudio', 'torchcodec'):\n"
        "    sys.modules[_n] = None\n"
    )
    os.environ["PYTHONPATH"] = hide
    for name in ("torchvision", "torchaudio", "torchcodec"):
        sys.modules[name] = None  # type: ignore[assignment]


def answer(llm: Any, case: dict[str, Any], SamplingParams: type) -> dict[str, Any]:
    """The case's answer from `llm` (vLLM's `LLM`, or nanovllm's with its `SamplingParams`:
    tests/test_seeded_like_vllm.py records nanovllm's the same way)."""
    try:
        params = SamplingParams(**case["params"])
        if case.get("sampling_params"):
            return {"ok": True}
        (out,) = llm.generate(
            case["prompt"],
            params,
            use_tqdm=False,
            tokenization_kwargs=case.get("tokenization_kwargs"),
        )
    except Exception as exc:  # the answer is the error
        return {
            "error": type(exc).__name__,
            "value_error": isinstance(exc, ValueError),
            "message": str(exc),
        }
    return {
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt": out.prompt,
        "token_ids": [list(o.token_ids) for o in out.outputs],
    }


def main() -> None:
    if os.environ.get("VLLM_HIDE_TORCHVISION"):
        hide_torchvision()
    import vllm
    from vllm import LLM, SamplingParams

    model, path = str(Path(sys.argv[1]).resolve()), sys.argv[2]
    doc = json.loads(Path(path).read_text())
    llm = LLM(
        model=model,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        block_size=32,  # vLLM's CPU attention: multiples of 32
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
    )
    for case in doc["cases"]:
        case["vllm"] = answer(llm, case, SamplingParams)
        print(case["name"], case["vllm"], file=sys.stderr)
    doc["vllm_version"] = f"vllm {vllm.__version__}"
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process
    main()
