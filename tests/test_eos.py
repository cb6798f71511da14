"""End-of-sequence sets: every EOS id of config.json and generation_config.json ends a request.

Oracles: transformers' `generate`, which stops at the same token on the same checkpoint, and the
rule written out (the union of both files; the tokenizer's EOS only when neither names one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.engine.eos import eos_token_ids


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data))


def test_the_eos_set_is_the_union_of_both_files(tmp_path) -> None:
    tokenizer = SimpleNamespace(eos_token_id=7)
    # Llama 3.1 Instruct style: a list in config.json, another in generation_config.json.
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [128001, 128009]})
    config = {"eos_token_id": [128001, 128008, 128009]}
    assert eos_token_ids(tmp_path, config, tokenizer) == {128001, 128008, 128009}
    write_json(tmp_path / "generation_config.json", {"eos_token_id": 5})
    assert eos_token_ids(tmp_path, {"eos_token_id": 2}, tokenizer) == {2, 5}
    (tmp_path / "generation_config.json").unlink()
    assert eos_token_ids(tmp_path, {"eos_token_id": 2}, tokenizer) == {2}
    assert eos_token_ids(tmp_path, {}, tokenizer) == {7}, "the tokenizer's EOS is the fallback"
    assert eos_token_ids(tmp_path, {}, SimpleNamespace(eos_token_id=None)) == frozenset()


def test_a_generation_config_eos_stops_like_transformers(tiny_llama, tmp_path) -> None:
    """A chat model ends its turn with an id that only generation_config.json lists."""
    from transformers import AutoModelForCausalLM

    prompt = [5, 17, 42, 9]
    plain = LLM(str(tiny_llama), block_size=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = plain.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    tokens = tokens.outputs[0].token_ids
    # An "end of turn" id: an output token that does not occur earlier in the output.
    cut = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    end_of_turn = tokens[cut]

    path = tmp_path / "chat_model"
    shutil.copytree(tiny_llama, path)
    config = json.loads((path / "config.json").read_text())
    assert config["eos_token_id"] == 1 and end_of_turn != 1
    write_json(path / "generation_config.json", {"eos_token_id": [1, end_of_turn]})

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12)
    expected = expected[0, len(prompt) :].tolist()

    llm = LLM(str(path), block_size=4)
    out = llm.generate(
        [{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )[0].outputs[0]
    assert out.token_ids == expected == tokens[: cut + 1]
    assert out.finish_reason == "stop"
