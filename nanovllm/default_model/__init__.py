"""The default model: a small Llama that ships inside the package, so everything runs offline.

This folder is itself a Hugging Face checkpoint (`config.json`, `model.safetensors`,
`generation_config.json`, `tokenizer.json`, `tokenizer_config.json`), trained from scratch on
the complete works of Shakespeare by `train.py` in this same folder. `README.md` is its model
card: architecture, tokenizer, how documents are delimited, the training command and the quality
figures.

Load it like any other checkpoint::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from nanovllm.default_model import DEFAULT_MODEL_PATH

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)

This module itself imports nothing heavy (no torch, no transformers): it only names the folder.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_PATH: Path = Path(__file__).resolve().parent
"""The folder holding the checkpoint files: pass it wherever a model name or path is expected."""

__all__ = ["DEFAULT_MODEL_PATH"]
