"""Test setup for the Triton kernels.

Triton decides between its CPU interpreter and the GPU compiler when a kernel is decorated, reading
TRITON_INTERPRET at that moment. So before any test module here imports a kernel (and with it
triton), `triton_setup.configure()` runs: no CUDA device -> TRITON_INTERPRET=1. It does not matter
what other test folders imported earlier: torch alone never imports triton, and when something did
(loading a Hugging Face model imports torch._dynamo, which imports triton), configure() re-wraps
Triton's own library functions for the interpreter (see triton_setup's docstring).
"""

from __future__ import annotations

import pytest

from nanovllm.kernels import triton_setup

if triton_setup.triton_available():
    triton_setup.configure()


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread) -> None:
    """Every kernel test runs torch single-threaded: the shapes are tiny, and the interpreter
    is single-threaded anyway (`one_torch_thread`, tests/conftest.py)."""
