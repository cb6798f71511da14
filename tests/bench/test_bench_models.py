"""The bench's derived checkpoints: a layer-skip draft (`NAME:N`) and a deepened target
(`NAME+N`), against the checkpoint they come from.

Oracles: the source's own tensors (a draft keeps exactly its first N layers; a deepened target
keeps every source tensor), transformers loading each folder, and the engine using the pair:
greedy output with the draft is the target's own (transformers), and the source, proposing for
its deepened self, has proposals accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import hf_greedy

from nanovllm import LLM, SamplingParams
from nanovllm.bench import models


@pytest.fixture(autouse=True)
def private_temp_dir(tmp_path, monkeypatch) -> None:
    """Built folders land under this test's temp dir, not the shared one later runs reuse."""
    monkeypatch.setattr(models.tempfile, "gettempdir", lambda: str(tmp_path))


def tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in path.glob("*.safetensors"):
        out.update(load_file(file))
    return out


def test_a_layer_skip_draft_keeps_exactly_the_first_layers(tiny_llama) -> None:
    draft = Path(models.resolve(f"{tiny_llama}:1").path)
    assert json.loads((draft / "config.json").read_text())["num_hidden_layers"] == 1
    source, kept = tensors(tiny_llama), tensors(draft)
    expected = {k for k in source if ".layers." not in k or ".layers.0." in k}
    assert set(kept) == expected
    assert all(torch.equal(kept[k], source[k]) for k in kept)
    assert (draft / "tokenizer.json").read_text() == (tiny_llama / "tokenizer.json").read_text()
    with pytest.raises(ValueError, match="needs 1 to 2 layers, got 3"):
        models.resolve(f"{tiny_llama}:3")


def test_a_deepened_target_keeps_its_source_and_the_source_drafts_for_it(tiny_llama) -> None:
    target = Path(models.resolve(f"{tiny_llama}+3").path)
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 5
    source, deep = tensors(tiny_llama), tensors(target)
    assert all(torch.equal(deep[k], source[k]) for k in source)
    assert len(deep) > len(source)
    prompts = [[5, 6, 7, 8], [20, 21, 22, 23, 24, 25]]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    spec = {"model": str(tiny_llama), "num_speculative_tokens": 3}
    llm = LLM(str(target), speculative_config=spec)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(target, prompts, 10)
    assert llm.llm_engine.stats.spec_decoding.num_accepted_tokens > 0
