"""The default model that ships inside the package: present, small, loadable offline, sane.

`nanovllm/default_model/` is a Hugging Face checkpoint trained by `train.py` in the same folder.
These tests check the contract the rest of the project relies on, not the training itself (that
takes half an hour): the files are there and small, `transformers` loads them from the folder
with no network, the tokenizer is lossless, BOS and EOS agree everywhere, and the weights are
trained (a Shakespeare passage costs far less than a uniform guess).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanovllm.default_model import DEFAULT_MODEL_PATH

CHECKPOINT_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
]

# The opening of Sonnet 18, with its layout: 12 verse lines, then the indented couplet.
PASSAGE = """\
XVIII

Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date:
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd,
And every fair from fair sometime declin'd,
By chance, or nature's changing course untrimm'd:
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st,
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st,
  So long as men can breathe, or eyes can see,
  So long lives this, and this gives life to thee.
"""

ROUND_TRIP_TEXTS = [
    "",
    "ROMEO.\nBut, soft! what light through yonder window breaks?\n",
    "\n\n\n[Enter HAMLET.]\n\n",
    "  So long as men can breathe, or eyes can see,  \n",
    "Café, naïve, rôle: é è ê ë; Æsop; “quotes” — dash; 日本語; emoji 🎭.",
    "tabs\tand\r\nwindows line ends\rand a lone CR",
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, local_files_only=True)
    return model.eval()


def test_default_model_path_is_the_package_folder() -> None:
    assert isinstance(DEFAULT_MODEL_PATH, Path)
    assert DEFAULT_MODEL_PATH.is_dir()
    assert (DEFAULT_MODEL_PATH / "__init__.py").is_file()


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_checkpoint_file_is_present(name: str) -> None:
    assert (DEFAULT_MODEL_PATH / name).is_file(), f"{name} missing from {DEFAULT_MODEL_PATH}"


def test_folder_is_at_most_20_mb() -> None:
    size = sum(p.stat().st_size for p in DEFAULT_MODEL_PATH.rglob("*") if p.is_file())
    assert size <= 20 * 1024 * 1024, f"{size / 2**20:.1f} MiB"


def test_architecture(model) -> None:
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    assert config.head_dim == 64
    assert config.max_position_embeddings >= 1024
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) <= 4_500_000


def test_special_tokens_agree(tokenizer, model) -> None:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    assert bos is not None and eos is not None and bos != eos
    assert tokenizer.pad_token_id not in (None, bos, eos)
    assert (model.config.bos_token_id, model.config.eos_token_id) == (bos, eos)
    generation = model.generation_config
    assert (generation.bos_token_id, generation.eos_token_id) == (bos, eos)
    assert not generation.do_sample
    assert model.config.vocab_size == len(tokenizer)


def test_encoding_starts_with_bos(tokenizer) -> None:
    ids = tokenizer("ROMEO.\n")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert ids[1:] == tokenizer.encode("ROMEO.\n", add_special_tokens=False)
    assert tokenizer.bos_token_id not in ids[1:]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trips(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    with_bos = tokenizer.encode(text)
    assert tokenizer.decode(with_bos, skip_special_tokens=True) == text


def test_tokenizer_compresses_english(tokenizer) -> None:
    # A few thousand merges learned on Shakespeare: well over two characters per token.
    assert len(PASSAGE) / len(tokenizer.encode(PASSAGE, add_special_tokens=False)) > 2.5


@torch.no_grad()
def test_loss_on_shakespeare_is_far_below_uniform(tokenizer, model) -> None:
    ids = torch.tensor([tokenizer.encode(PASSAGE)])  # BOS + passage, as in training
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    uniform = math.log(model.config.vocab_size)
    assert loss < 0.6 * uniform, f"{loss:.2f} nats/token vs {uniform:.2f} for a uniform model"


@torch.no_grad()
def test_greedy_generation_continues_the_prompt(tokenizer, model) -> None:
    prompt = tokenizer("HAMLET.\nTo be, or not to be,", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    new = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    assert any(c.isalpha() for c in new)


@torch.no_grad()
def test_a_finished_scene_ends_on_eos(tokenizer, model) -> None:
    # Documents are scenes, trained as BOS scene EOS: after a scene's closing stage direction the
    # most likely next token is EOS, so requests can finish before max_tokens.
    scene = (
        "SCENE IX. Another part of the Plain.\n\n[Enter ANTONY and ENOBARBUS.]\n\n"
        "ANTONY.\nSet we our squadrons on yon side o' the hill,\n"
        "In eye of Caesar's battle; from which place\nWe may the number of the ships behold,\n"
        "And so proceed accordingly.\n\n[Exeunt.]\n"
    )
    ids = torch.tensor([tokenizer.encode(scene)])
    probs = model(input_ids=ids).logits[0, -1].softmax(-1)
    assert probs.argmax().item() == tokenizer.eos_token_id
    assert probs[tokenizer.eos_token_id] > 0.5
