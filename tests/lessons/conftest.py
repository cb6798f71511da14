"""What the lesson tests share: one torch thread, Triton for lesson 05, a private NANOVLLM_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: extra threads only contend (badly, on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _triton_for_the_kernel_lesson(request):
    """Lesson 05's kernels need Triton, which ships for Linux x86_64 only."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    lesson = params.get("lesson")
    if lesson is not None and lesson.name == "05_triton_kernel":
        pytest.importorskip("triton")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NANOVLLM_HOME", str(tmp_path))
    return tmp_path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """CI runs this folder with two pytest-xdist workers (`.ci/run`). The tests that read their
    command's result from the `commands` fixture (`commands_ahead.py`) all go to one of them, as
    one group: that fixture starts every such test's command ahead, and the other worker would
    start them all again."""
    for item in items:
        if "commands" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("commands"))
