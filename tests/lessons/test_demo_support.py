"""The lessons' derived demo models, kept under $NANOVLLM_HOME, follow the checkout they run from.

`windowed_model_path` links the demo model's weights and tokenizer into a model folder of its own
(lesson 16's sliding model). A folder written by another checkout, since removed, holds links
that lead nowhere; it must be written again, not returned.
"""

from __future__ import annotations

from nanovllm.lessons import demo_support
from nanovllm.lessons.workspace import HOME_ENV


def test_a_windowed_model_written_from_a_removed_checkout_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    path = demo_support.windowed_model_path(24)
    stale = tmp_path / "gone" / "tokenizer.json"  # (the old checkout's file, since removed)
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.json").symlink_to(stale)
    again = demo_support.windowed_model_path(24)
    assert again == path
    assert (again / "tokenizer.json").is_file()
    assert all(f.exists() for f in again.iterdir())
