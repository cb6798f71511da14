"""What `test_serve_side_by_side.py` cannot see from the answers alone: the served name the CLI
picks, the warning that names ignored fields, several served names, and
`truncate_prompt_tokens` offline. Oracles: vLLM's rules (stated in each test), and the engine's
own answer to the truncated prompt given directly.
"""

from __future__ import annotations

import argparse
import logging

import httpx
import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.serve.api_server import build_app
from nanovllm.serve.cli import add_arguments, served_model_names
from nanovllm.serve.server import ServerThread


def names(argv: list[str]) -> list[str] | None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return served_model_names(parser.parse_args(argv))


def test_the_model_is_served_under_the_name_given():
    # vLLM: `vllm serve /path/to/ckpt` serves "/path/to/ckpt"; --served-model-name takes several.
    assert names(["/path/to/ckpt"]) == ["/path/to/ckpt"]
    assert names(["--model", "./ckpt"]) == ["./ckpt"]
    assert names(["./ckpt", "--served-model-name", "a", "b"]) == ["a", "b"]
    assert names([]) is None  # the embedded model: its folder's name


def test_any_served_name_is_accepted_and_the_first_answers(async_engine):
    app = build_app(async_engine, served_model_name=["first", "second"], model_root="/ckpt")
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as client:
        cards = client.get("/v1/models").json()["data"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
            ("first", "/ckpt", None),
            ("second", "/ckpt", None),
        ]
        assert all(c["permission"][0]["object"] == "model_permission" for c in cards)
        body = {"model": "second", "prompt": [5, 6, 7], "max_tokens": 1}
        answer = client.post("/v1/completions", json=body)
        assert answer.status_code == 200 and answer.json()["model"] == "first"
        assert client.post("/v1/completions", json={**body, "model": "third"}).status_code == 404


def test_unknown_fields_are_ignored_and_named_in_a_warning(server, caplog):
    body = {"prompt": [5, 6, 7], "max_tokens": 1, "zzz_unknown": 1, "cache_salt": "s"}
    with caplog.at_level(logging.WARNING, logger="nanovllm.serve"):
        assert httpx.post(server.url + "/v1/completions", json=body).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert warnings == [
        "The following fields were present in the request but ignored: "
        "['cache_salt', 'zzz_unknown']"
    ]


def test_truncate_prompt_tokens_offline_keeps_the_last_tokens(offline_llm: LLM):
    """vLLM 0.32's form: `generate(..., tokenization_kwargs={"truncate_prompt_tokens": k})`."""
    prompt = [11, 12, 13, 14, 15, 16, 17]
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    (cut,) = offline_llm.generate(
        [prompt], greedy, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": 3}
    )
    (alone,) = offline_llm.generate([prompt[-3:]], greedy, use_tqdm=False)
    (whole,) = offline_llm.generate(  # -1: max_model_len - 1, all of these fit
        [prompt], greedy, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": -1}
    )
    assert cut.prompt_token_ids == prompt[-3:] and cut.prompt is None
    assert cut.outputs[0].token_ids == alone.outputs[0].token_ids
    assert whole.prompt_token_ids == prompt
    # A text prompt is cut by the tokenizer (a BOS it adds stays first), its text kept.
    tokenizer = offline_llm.get_tokenizer()
    ids = tokenizer.encode("The quick brown fox")
    (text_cut,) = offline_llm.generate(
        "The quick brown fox",
        greedy,
        use_tqdm=False,
        tokenization_kwargs={"truncate_prompt_tokens": 2},
    )
    kept = ids[:1] + ids[-1:] if ids[0] == tokenizer.bos_token_id else ids[-2:]
    assert text_cut.prompt_token_ids == kept and text_cut.prompt == "The quick brown fox"


def test_sampling_params_refuse_truncate_prompt_tokens_as_vllm_does(offline_llm: LLM):
    """vLLM 0.32's SamplingParams has no truncate_prompt_tokens (vllm/sampling_params.py: a
    msgspec Struct without the field, so the keyword is a TypeError); ours names the value and
    the keyword that takes it. (Recorded from vLLM: tests/test_seeded_like_vllm.py.)"""
    with pytest.raises(TypeError, match=r"truncate_prompt_tokens=3 .*tokenization_kwargs"):
        SamplingParams(truncate_prompt_tokens=3)
    with pytest.raises(ValueError, match="only 'truncate_prompt_tokens'"):
        offline_llm.generate([[11, 12]], use_tqdm=False, tokenization_kwargs={"max_length": 3})
    with pytest.raises(ValueError, match="got 0"):
        offline_llm.generate(
            [[11, 12]], use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": 0}
        )
