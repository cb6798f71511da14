"""The CPU backend's malloc thresholds (nanovllm/backends/cpu_malloc.py).

Oracle: the kernel's count of minor page faults (`getrusage`), in a fresh process, over
activations of prefill chunks of growing size (allocated, written, freed): with the thresholds
set, memory freed by one is reused by the next without a fault.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PATTERN = """
import resource, sys, torch
from nanovllm.backends.cpu_malloc import keep_freed_memory
set_ = keep_freed_memory() if sys.argv[1] == "keep" else None

def step(tokens):  # a prefill chunk's largest activation: SmolLM2-135M's gate_up output
    torch.empty(tokens, 3072).fill_(1.0)  # allocated, written, freed

step(16)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for tokens in range(128, 2049, 128):  # chunks of growing size, as a scheduler's vary
    step(tokens)
pages = sum(range(128, 2049, 128)) * 3072 * 4 // 4096
print(set_, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, pages)
"""


def run_pattern(mode: str, env: dict | None = None) -> tuple[str, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_freed_activations_are_reused_without_page_faults() -> None:
    was_set, faults, pages = run_pattern("keep")
    assert was_set == "True"
    # Only the heap's growth to the largest chunk is new memory: 6,121 faults for 52,224 pages
    # written (11,113 in one run of ten). By default each chunk larger than any freed before is
    # mapped afresh and given back when freed: every page written is a fault (52,240).
    assert faults < pages // 3, (faults, pages)


def test_a_threshold_set_in_the_environment_is_left_alone() -> None:
    import os

    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="131072")
    was_set, _, _ = run_pattern("keep", env)
    assert was_set == "False"
