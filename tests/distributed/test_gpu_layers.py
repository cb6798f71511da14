"""The parallel layers on CUDA: alone on one GPU, and over NCCL on two (skipped without them).

The same per-rank checks as the gloo tests (`rank_checks.RankChecks`), on GPU tensors.
"""

from __future__ import annotations

import functools

import pytest
import torch
from rank_checks import RankChecks

from nanovllm.distributed import WorkerGroup, as_tp_rank

pytestmark = pytest.mark.gpu
TOL = 1e-3
CASES = [
    ("column", 0, 5, 24, 16, True, True),
    ("row", 1, 5, 16, 24, True, False),
    ("mlp", 2, 7, 32, 64, False),
    ("attention", 3, 9, 64, 8, 1, 16, True),  # one KV head, replicated on both ranks
    ("attention", 4, 9, 64, 8, 4, 16, False),
    ("embedding", 5, 9, 37, 8),
    ("lm_head", 6, 9, 37, 8, True),
]


def error_of(result) -> float:
    return result["diff"] if isinstance(result, dict) else result


@pytest.fixture
def on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    yield
    torch.set_default_device("cpu")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_layers_alone_on_one_gpu(on_cuda, case):
    method, *args = case
    with as_tp_rank(0, 1):
        assert error_of(getattr(RankChecks(0, "cuda"), method)(*args)) < TOL


def test_layers_over_nccl_on_two_gpus(on_cuda):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    factory = functools.partial(RankChecks, device="cuda")
    with WorkerGroup(2, factory, device_type="cuda", timeout_s=120) as group:
        for method, *args in CASES:
            assert max(map(error_of, group.run_all(method, *args))) < TOL, method
        for result in group.run_all("collectives", 7):
            assert result == {"reduce": 0.0, "gather": 0.0, "object": True, "inputs": True}
