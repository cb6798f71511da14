"""vLLM's offline API: `LLM.chat`, TextPrompt / TokensPrompt dicts, and a vLLM script as is.

The oracle is transformers: its own chat template rendering (`apply_chat_template` with
`tokenize=True`) and its own greedy generation on the same checkpoint.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from tiny_models import hf_greedy, make_model

from nanovllm import LLM, SamplingParams, TextPrompt, TokensPrompt

MAX_TOKENS = 6
# Uses the tokenizer's BOS, so a second BOS (encoding with special tokens) would show.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Write about "}, {"type": "text", "text": "Romeo."}],
    },
]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A tiny model with a chat template, whose tokenizer adds BOS when encoding (as Llama's)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    path = make_model(tmp_path_factory.mktemp("chat_model"))
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def llm(chat_model) -> LLM:
    return LLM(str(chat_model), max_model_len=256)


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def hf_chat_ids(path: Path, conversation: list[dict], **kwargs) -> list[int]:
    """transformers' rendering of the conversation, tokenized by transformers."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    flat = [
        {
            **m,
            "content": m["content"]
            if isinstance(m["content"], str)
            else "".join(p["text"] for p in m["content"]),
        }
        for m in conversation
    ]
    ids = tokenizer.apply_chat_template(flat, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_chat_matches_transformers(llm, chat_model):
    expected_ids = hf_chat_ids(chat_model, CONVERSATION, add_generation_prompt=True)
    tokenizer = llm.get_tokenizer()
    bos = tokenizer.bos_token_id
    assert tokenizer.encode("x")[0] == bos  # encoding adds a BOS: the template has one already
    assert expected_ids.count(bos) == 1
    short = CONVERSATION[:2]
    outputs = llm.chat([CONVERSATION, short], greedy(), use_tqdm=False)
    assert outputs[0].prompt_token_ids == expected_ids
    assert outputs[1].prompt_token_ids == hf_chat_ids(chat_model, short, add_generation_prompt=True)
    oracle = hf_greedy(chat_model, [o.prompt_token_ids for o in outputs], MAX_TOKENS)
    assert [o.outputs[0].token_ids for o in outputs] == oracle
    # One conversation (not in a list) is one output, the same as in the batch.
    (single,) = llm.chat(CONVERSATION, greedy(), use_tqdm=False)
    assert single.outputs[0].token_ids == oracle[0]


def test_chat_options(llm, chat_model):
    (cont,) = llm.chat(
        CONVERSATION[:3],
        greedy(),
        use_tqdm=False,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert cont.prompt_token_ids == hf_chat_ids(
        chat_model, CONVERSATION[:3], add_generation_prompt=False, continue_final_message=True
    )
    assert cont.prompt.endswith("How can I assist you today?")
    (custom,) = llm.chat(
        CONVERSATION[:2], greedy(), use_tqdm=False, chat_template="{{ messages[-1]['content'] }}!"
    )
    assert custom.prompt == "Hello!"
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(CONVERSATION, continue_final_message=True, use_tqdm=False)
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\].*'image_url'"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ValueError, match="messages is empty"):
        llm.chat([])


def test_chat_without_a_template_names_the_model(tmp_path):
    path = make_model(tmp_path / "base-model")  # its tokenizer has no chat template
    base = LLM(str(path), max_model_len=64)
    with pytest.raises(ValueError, match=r"base-model.*no chat template.*chat_template="):
        base.chat(CONVERSATION[:2], greedy(), use_tqdm=False)
    (out,) = base.chat(CONVERSATION[:2], greedy(), use_tqdm=False, chat_template=CHAT_TEMPLATE)
    assert len(out.outputs[0].token_ids) == MAX_TOKENS


def test_prompt_dicts_are_the_same_prompts(llm):
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("ROMEO:\n")
    forms = [
        "ROMEO:\n",
        ids,
        TextPrompt(prompt="ROMEO:\n"),
        {"prompt": "ROMEO:\n"},
        TokensPrompt(prompt_token_ids=ids),
        {"prompt_token_ids": ids, "prompt": "ROMEO:\n"},
    ]
    outputs = llm.generate(forms, greedy(), use_tqdm=False)
    assert all(o.prompt_token_ids == ids for o in outputs)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
    assert [o.prompt for o in outputs] == ["ROMEO:\n", None, *["ROMEO:\n"] * 2, None, "ROMEO:\n"]
    (one,) = llm.generate(TokensPrompt(prompt_token_ids=ids), greedy(), use_tqdm=False)
    assert one.outputs[0].token_ids == outputs[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="'multi_modal_data'"):
        llm.generate({"prompt": "x", "multi_modal_data": {"image": None}}, use_tqdm=False)
    with pytest.raises(ValueError, match="needs 'prompt'"):
        llm.generate([{}], use_tqdm=False)


# Written against vLLM's API (in the style of vLLM's examples/offline_inference); the test runs
# it with only `vllm` renamed to `nanovllm`.
VLLM_SCRIPT = """
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

prompts = ["ROMEO:\\n", "JULIET:\\n"]
sampling_params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
llm = LLM(model=MODEL_PATH, max_model_len=256, seed=0, gpu_memory_utilization=0.5,
          enable_prefix_caching=True)

outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")

token_outputs = llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7]), {"prompt": "ROMEO:\\n"}],
                             sampling_params=sampling_params, use_tqdm=False)

conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
]
chat_outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
tokenizer = llm.get_tokenizer()
"""


def test_a_vllm_script_runs_unchanged(chat_model, tmp_path, capsys):
    script = tmp_path / "offline_inference.py"
    script.write_text(re.sub(r"\bvllm\b", "nanovllm", VLLM_SCRIPT))
    result = runpy.run_path(str(script), init_globals={"MODEL_PATH": str(chat_model)})
    tokenizer = result["tokenizer"]
    outputs, token_outputs, chat_outputs = (
        result["outputs"],
        result["token_outputs"],
        result["chat_outputs"],
    )
    prompt_ids = [
        tokenizer.encode("ROMEO:\n"),
        tokenizer.encode("JULIET:\n"),
        [5, 6, 7],
        hf_chat_ids(chat_model, result["conversation"], add_generation_prompt=True),
    ]
    oracle = hf_greedy(chat_model, prompt_ids, MAX_TOKENS)
    got = [o.outputs[0].token_ids for o in [*outputs, token_outputs[0], chat_outputs[0]]]
    assert got == oracle
    assert token_outputs[1].outputs[0].token_ids == oracle[0]
    printed = capsys.readouterr().out
    assert f"Prompt: 'ROMEO:\\n', Generated text: {outputs[0].outputs[0].text!r}" in printed
