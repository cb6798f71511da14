"""Shared test setup: a deterministic hypothesis profile and tiny checkpoints.

CI runs with `HYPOTHESIS_PROFILE=ci` (set by .ci/run): derandomized, so a run is reproducible,
with no deadline (a 2-core CI machine has noisy timing). Locally the default profile explores
with fresh random examples each run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, str(Path(__file__).parent))  # for `tiny_models`

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The planted-bug check (test_planted_bugs.py): CI's examples, without shrinking the failure
# (only *that* it fails matters there, and shrinking can take longer than finding).
settings.register_profile(
    "planted",
    parent=settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer random Llama (GQA 4:2, head_dim 16) saved with transformers."""
    from tiny_models import make_model

    return make_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")
