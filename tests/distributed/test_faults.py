"""A rank that dies, raises, or hangs ends the group with an error naming it: no hang, no orphan.

Each fault ends its group, so each test starts its own (about a second on two cores). Every
wait is bounded: the groups use a short collective timeout, and pytest's own limits are not
relied on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from proc_utils import wait_until_gone
from rank_checks import RankChecks

from nanovllm.distributed import WorkerDiedError, WorkerGroup, WorkerGroupError, get_tp_world_size
from nanovllm.distributed.parallel_state import init_distributed

TIMEOUT_S = 20  # the groups' collective timeout: far above a healthy step, far below a hang


def assert_all_gone(pids) -> None:
    assert wait_until_gone(list(pids), timeout_s=10) == [], "orphan worker processes"
    assert get_tp_world_size() == 1


def test_a_rank_that_exits_mid_collective_is_named_and_the_rest_are_stopped():
    """Rank 1 exits while rank 0 and rank 2 wait for it in an all-reduce."""
    group = WorkerGroup(3, RankChecks, timeout_s=TIMEOUT_S)
    pids = group.pids
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match="rank 1 died: exited with code 3") as info:
        group.run("all_reduce_unless", 1, "exit")
    assert info.value.rank == 1
    assert time.monotonic() - start < TIMEOUT_S / 2  # seen by the monitor, not by a timeout
    assert_all_gone(pids.values())


def test_a_rank_that_raises_sends_back_its_traceback():
    group = WorkerGroup(2, RankChecks, timeout_s=TIMEOUT_S)
    pids = group.pids
    with pytest.raises(WorkerDiedError, match="rank 1 died: it raised") as info:
        group.run("all_reduce_unless", 1, "raise")
    assert "ValueError: rank 1 cannot go on" in info.value.reason
    assert_all_gone(pids.values())


def test_a_killed_rank_is_reported_at_the_next_call():
    group = WorkerGroup(2, RankChecks, timeout_s=TIMEOUT_S)
    os.kill(group.pids[1], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(WorkerDiedError, match="rank 1 died: killed by signal SIGKILL"):
        group.run("whoami")
    assert_all_gone(group.pids.values())


def test_a_rank_that_hangs_is_caught_by_the_timeout():
    group = WorkerGroup(2, RankChecks, timeout_s=2, start_timeout_s=120)
    start = time.monotonic()
    with pytest.raises(WorkerGroupError, match="every worker alive") as info:
        group.run_all("sleep", {1: 60.0})  # rank 0 waits for rank 1's answer
    assert not isinstance(info.value, WorkerDiedError)
    assert time.monotonic() - start < 15
    assert_all_gone(group.pids.values())


def test_a_rank_that_fails_to_start_is_named():
    with pytest.raises(WorkerDiedError, match="rank 1 died: it raised") as info:
        WorkerGroup(2, FailsOnRank1, timeout_s=TIMEOUT_S)
    assert "no weights for rank 1" in info.value.reason
    assert get_tp_world_size() == 1


@pytest.mark.slow  # (13 s: the rank's 8 s deadline passes)
def test_a_rank_that_misses_the_start_deadline_shows_where_it_waits(capfd):
    """A rank still building its worker at the deadline: the error names the rank and the phase,
    and the rank's own stack (printed on the driver's SIGUSR1) shows the line it waits in."""
    with pytest.raises(WorkerGroupError, match=r"ranks \[1\] did not become 'ready' within 8"):
        WorkerGroup(2, SlowOnRank1, timeout_s=TIMEOUT_S, start_timeout_s=8)
    assert "in __init__" in capfd.readouterr().err  # SlowOnRank1.__init__'s sleep, on rank 1
    assert get_tp_world_size() == 1


@pytest.mark.slow  # (6 s: a rendezvous times out, then a group starts)
def test_a_driver_whose_group_never_formed_can_start_the_next(tmp_path):
    """A rendezvous that timed out in this process (rank 1 never came) must not stop the next
    group from forming: torch counted a group name for it, and fresh workers start from 0 (the
    CI run of stop 64: every group after one failure waited out its timeout)."""
    store = dist.FileStore(str(tmp_path / "store"), 2)
    with pytest.raises(RuntimeError):
        init_distributed(0, 2, timeout_s=1, store=store)  # rank 1 never joins
    assert get_tp_world_size() == 1
    start = time.monotonic()
    with WorkerGroup(2, RankChecks, timeout_s=TIMEOUT_S, start_timeout_s=30) as group:
        assert group.run_all("whoami")[1][:2] == (1, 2)
    assert time.monotonic() - start < 20


class SlowOnRank1:
    def __init__(self, rank: int) -> None:
        if rank == 1:
            time.sleep(60)


class FailsOnRank1:
    def __init__(self, rank: int) -> None:
        if rank == 1:
            raise FileNotFoundError("no weights for rank 1")


DRIVER = """
import os, signal, sys
from rank_checks import RankChecks
from nanovllm.distributed import WorkerGroup
group = WorkerGroup(2, RankChecks, timeout_s=60)
print(group.pids[1], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_exit_when_the_driver_is_killed():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(
        [sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    worker_pid = int(result.stdout.split()[0])
    assert wait_until_gone([worker_pid], timeout_s=10) == [], "the worker outlived its driver"
