"""The kernels compile for a real GPU, checked without one.

The interpreter tests check what the kernels compute, but not that Triton's compiler accepts them.
`nanovllm.kernels.compile_check` records the launches the wrappers make and compiles them for
sm_90 (H100/H200) with Triton's bundled ptxas, in a fresh process with TRITON_INTERPRET=0, and
fails on a compile error or on shared memory past the architecture's limit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (Linux x86_64 only)")


@pytest.mark.skipif(
    tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 4),
    reason="compile_check uses Triton >= 3.4 internals (binder, ASTSource signature by name)",
)
def test_kernels_compile_for_hopper() -> None:
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    r = subprocess.run(
        [sys.executable, "-m", "nanovllm.kernels.compile_check", "--arch", "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all compiled" in r.stdout
