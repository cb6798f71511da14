"""`import nanovllm` sets OpenMP's wait policy before torch loads libgomp, and keeps the user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nanovllm import openmp_wait_policy


def policy_in_a_fresh_process(env: dict[str, str], code: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", code + "; import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return run.stdout.strip().splitlines()[-1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in openmp_wait_policy.USER_SETTINGS}
    return env | extra


def test_importing_nanovllm_first_makes_idle_threads_sleep() -> None:
    assert policy_in_a_fresh_process(clean_env(), "import nanovllm") == "PASSIVE"


@pytest.mark.parametrize("name", openmp_wait_policy.USER_SETTINGS)
def test_a_wait_policy_the_user_chose_is_kept(name: str) -> None:
    env = {name: "ACTIVE" if name == "OMP_WAIT_POLICY" else "1000"}
    assert openmp_wait_policy.apply(env) == "kept"
    assert env == {name: env[name]}


def test_after_torch_it_is_too_late_and_says_so(caplog) -> None:
    import torch  # noqa: F401  (loaded, as in this test process)

    env: dict[str, str] = {}
    assert openmp_wait_policy.apply(env) == "late"
    assert "OMP_WAIT_POLICY=PASSIVE" in caplog.text
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}  # (the processes it starts get it)


def test_another_program_gets_the_environment_without_the_policy_set_here() -> None:
    code = "import nanovllm.openmp_wait_policy as p; print(p.environ_for_others().get('OMP_WAIT_POLICY'))"
    for env, expected in [(clean_env(), "None"), (clean_env(OMP_WAIT_POLICY="ACTIVE"), "ACTIVE")]:
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert run.stdout.split() == [expected], run.stderr
