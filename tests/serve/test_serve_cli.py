"""`nanovllm serve`: its options, and clean failures before anything is started."""

from __future__ import annotations

import argparse

import pytest

from nanovllm.cli import main
from nanovllm.serve.cli import add_arguments


def test_help_lists_server_and_engine_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--host",
        "--port",
        "--served-model-name",
        "--chat-template",
        "--max-num-seqs",
        "--api-key",
        "--gpu-memory-utilization",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--max-request-body-bytes",
        "--max-concurrent-requests",
    ):
        assert option in text


def test_missing_chat_template_file_is_an_error(tmp_path, capsys):
    assert main(["serve", "--chat-template", str(tmp_path / "nope.jinja")]) == 2
    assert "cannot read chat template" in capsys.readouterr().err


def test_bad_model_folder_is_an_error(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["serve", str(tmp_path)]) == 2  # the positional form, as `vllm serve MODEL`
    assert "error:" in capsys.readouterr().err


def parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_vllm_style_flags_reach_the_engine_config():
    from nanovllm import EngineConfig
    from nanovllm.serve.cli import engine_config_options

    args = parse(["./ckpt", "--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching"])
    options = engine_config_options(args)
    assert options["model"] == "./ckpt"
    assert options["gpu_memory_utilization"] == 0.5
    assert options["enable_prefix_caching"] is False
    assert options["enable_chunked_prefill"] is True
    assert EngineConfig(**options).gpu_memory_utilization == 0.5
    assert engine_config_options(parse(["--model", "./a"]))["model"] == "./a"
    assert engine_config_options(parse(["--no-prefix-caching"]))["enable_prefix_caching"] is False
    off = engine_config_options(parse(["--no-enable-chunked-prefill"]))
    assert off["enable_chunked_prefill"] is False
    with pytest.raises(ValueError, match="two models"):
        engine_config_options(parse(["./a", "--model", "./b"]))
    with pytest.raises(ValueError, match="--enable-prefix-caching contradicts --no-prefix-caching"):
        engine_config_options(parse(["--enable-prefix-caching", "--no-prefix-caching"]))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(**engine_config_options(parse(["--gpu-memory-utilization", "1.5"])))


def test_server_defaults_are_safe_and_the_key_comes_from_the_environment(monkeypatch):
    from nanovllm.serve.cli import serve_options, server_options

    monkeypatch.delenv("NANOVLLM_API_KEY", raising=False)
    args = parse([])
    assert args.host == "127.0.0.1"
    options = server_options(args)
    assert options == {
        "api_key": None,
        "max_request_body_bytes": 2 * 2**20,
        "max_concurrent_requests": 1024,
        "body_timeout": 60.0,
    }
    monkeypatch.delenv("NANOVLLM_KEEP_ALIVE_ON_ENGINE_DEATH", raising=False)
    assert serve_options(args) == {
        "shutdown_timeout": 20.0,
        "header_timeout": 10.0,
        "keep_alive_on_engine_death": False,
    }
    monkeypatch.setenv("NANOVLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    assert serve_options(parse([]))["keep_alive_on_engine_death"] is True
    assert serve_options(parse(["--keep-alive-on-engine-death"]))["keep_alive_on_engine_death"]
    for flag in ("--shutdown-timeout", "--header-timeout", "--body-timeout"):
        with pytest.raises(ValueError, match=flag):
            options = parse([flag, "-1"])
            serve_options(options)
            server_options(options)
    monkeypatch.setenv("NANOVLLM_API_KEY", "from-env")
    assert server_options(parse([]))["api_key"] == "from-env"
    assert server_options(parse(["--api-key", "from-flag"]))["api_key"] == "from-flag"
    assert (
        server_options(parse(["--max-concurrent-requests", "0"]))["max_concurrent_requests"] is None
    )
    with pytest.raises(ValueError, match="--max-request-body-bytes"):
        server_options(parse(["--max-request-body-bytes", "0"]))


def test_speculative_config_flag_reaches_the_engine_config(capsys):
    from nanovllm import EngineConfig
    from nanovllm.serve.cli import engine_config_options

    assert engine_config_options(parse([]))["speculative_config"] is None
    config = '{"method": "ngram", "num_speculative_tokens": 2}'
    options = engine_config_options(parse(["--speculative-config", config]))
    assert options["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2}
    assert EngineConfig(**options).speculative_config == options["speculative_config"]
    with pytest.raises(ValueError, match=r"--speculative-config is not valid JSON .*'\{ngram'"):
        engine_config_options(parse(["--speculative-config", "{ngram"]))
    # A bad value in good JSON: the engine's own error, naming it; nothing is started.
    assert main(["serve", "--speculative-config", '{"method": "medusa"}']) == 2
    assert "unknown method 'medusa'" in capsys.readouterr().err


def test_conflicting_model_flags_exit_2(capsys):
    assert main(["serve", "./a", "--model", "./b"]) == 2
    assert "two models" in capsys.readouterr().err


def test_the_serve_readme_lists_every_flag():
    from pathlib import Path

    import nanovllm.serve

    readme = (Path(nanovllm.serve.__file__).parent / "README.md").read_text()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert len(flags) > 20
    missing = [flag for flag in flags if f"`{flag}`" not in readme]
    assert not missing


def test_the_server_freezes_its_start_up_objects_before_serving(tiny_llama, monkeypatch):
    """A full garbage collection walking the model's objects stalled every stream (measured in
    the disaggregation bench): they are frozen (`gc.freeze`) before the first request."""
    import gc

    import nanovllm.serve.server

    seen = []
    monkeypatch.setattr(gc, "freeze", lambda: seen.append("freeze"))
    monkeypatch.setattr(
        nanovllm.serve.server,
        "serve",
        lambda app, host, port, log_level, **options: seen.append("serve") or 0,
    )
    assert main(["serve", str(tiny_llama), "--port", "1"]) == 0
    assert seen == ["freeze", "serve"]
