"""`nanovllm serve`: its options, and clean failures before anything is started."""

from __future__ import annotations

import pytest

from nanovllm.cli import main


def test_help_lists_server_and_engine_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--host", "--port", "--served-model-name", "--chat-template", "--max-num-seqs"):
        assert option in text


def test_missing_chat_template_file_is_an_error(tmp_path, capsys):
    assert main(["serve", "--chat-template", str(tmp_path / "nope.jinja")]) == 2
    assert "cannot read chat template" in capsys.readouterr().err


def test_bad_model_folder_is_an_error(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err
