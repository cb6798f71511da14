"""triton_setup: importing nanovllm.kernels never imports triton, and the interpreter-vs-compiled
decision holds whatever was imported first. Each case runs in a fresh Python process, because the
decision is per process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nanovllm.kernels import triton_setup

requires_triton = pytest.mark.skipif(
    not triton_setup.triton_available(), reason="triton is not installed (Linux x86_64 only)"
)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a clean start
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_package_import_does_not_import_triton() -> None:
    r = _run(
        """
        import sys
        import nanovllm.kernels
        from nanovllm.kernels.reference import paged_attention_ref, store_kvcache_ref
        assert "triton" not in sys.modules, "nanovllm.kernels imported triton"
        """
    )
    assert r.returncode == 0, r.stderr


@requires_triton
def test_this_process_interprets_exactly_when_there_is_no_gpu() -> None:
    if "TRITON_INTERPRET" in os.environ and not torch.cuda.is_available():
        assert triton_setup.is_interpreted() == (os.environ["TRITON_INTERPRET"] == "1")
    else:
        assert triton_setup.is_interpreted() == (not torch.cuda.is_available())


@requires_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_kernels_run_interpreted_even_when_triton_was_imported_first() -> None:
    # Loading a Hugging Face model imports torch._dynamo, which imports triton, long before our
    # kernels: Triton's own library (tl.sum, tl.cdiv, ...) is then decorated for the compiler.
    r = _run(
        f"""
        import sys, torch, triton
        import triton.language as tl
        assert type(tl.cdiv).__name__ == "JITFunction"
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from kernel_testing import BatchSpec, assert_close, build_batch
        from nanovllm.kernels.paged_attention import paged_attention
        from nanovllm.kernels.paged_attention_naive import paged_attention_naive
        from nanovllm.kernels.reference import paged_attention_ref
        assert type(tl.cdiv).__name__ == "InterpretedFunction"
        spec = BatchSpec((9, 5), (1, 1), block_size=4, num_kv_heads=2, group=2, head_dim=16,
                         dtype=torch.float32)
        b = build_batch(spec)
        expected = paged_attention_ref(*b.args())
        assert_close(paged_attention(*b.args(), num_splits=2), expected)
        q, kc, vc, bt, sl, _, scale = b.args()
        assert_close(paged_attention_naive(q, kc, vc, bt, sl, scale), expected)
        """
    )
    assert r.returncode == 0, r.stderr


@requires_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_contradicting_triton_setting_raises_clearly() -> None:
    r = _run(
        """
        import os, triton
        triton.knobs.runtime.interpret = False  # forced off in code after startup...
        os.environ["TRITON_INTERPRET"] = "1"  # ...while the environment says the opposite
        from nanovllm.kernels import triton_setup
        try:
            triton_setup.configure()
        except RuntimeError as e:
            print(e)
        else:
            raise SystemExit("no error")
        """
    )
    assert r.returncode == 0, r.stderr
    assert "TRITON_INTERPRET" in r.stdout
