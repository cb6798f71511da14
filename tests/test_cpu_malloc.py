"""The CPU backend's malloc thresholds (nanovllm/backends/cpu_malloc.py).

Oracle: the kernel's count of minor page faults (`getrusage`), in a fresh process, over a
prefill-sized MLP (megabyte activations allocated, used and freed): with the thresholds set,
memory freed by one layer is reused by the next without a fault.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PATTERN = """
import resource, sys, torch, torch.nn.functional as F
from nanovllm.backends.cpu_malloc import keep_freed_memory
torch.set_num_threads(1)
set_ = keep_freed_memory() if sys.argv[1] == "keep" else None
# A 2,048-token chunk through SmolLM2-135M's MLP shapes (hidden 576, intermediate 1,536).
w1, w2 = torch.randn(3072, 576) * 0.02, torch.randn(576, 1536) * 0.02

def layer_like(x):
    gate, up = F.linear(x, w1).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w2)

x = torch.randn(2048, 576)
for _ in range(2):  # warm-up: the heap grows to the working set
    x = layer_like(x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    x = layer_like(x)
print(set_, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def run_pattern(mode: str, env: dict | None = None) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_freed_activations_are_reused_without_page_faults() -> None:
    was_set, faults = run_pattern("keep")
    assert was_set == "True"
    # (By default, glibc gave memory back and faulted it in again: 21,472 faults in four such
    # layers, 2,304 with oneDNN's packed matmuls; with the thresholds, none.)
    assert faults < 100, faults


def test_a_threshold_set_in_the_environment_is_left_alone() -> None:
    import os

    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="131072")
    was_set, _ = run_pattern("keep", env)
    assert was_set == "False"
