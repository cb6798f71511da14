"""A tensor-parallel group listens on its address alone, and shows a stranger nothing.

Oracles: the kernel's table of listening sockets (`tests/listeners.py`), and torch's own key
names, which a client of an unprotected rendezvous store reads (a rank's gloo address) and
could write (posing as a rank).
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import torch.distributed as dist
from rank_checks import RankChecks

sys.path.insert(0, str(Path(__file__).parent.parent))  # for `listeners`
from listeners import beyond_loopback  # noqa: E402

from nanovllm.distributed import WorkerGroup  # noqa: E402
from nanovllm.distributed.rendezvous import GLOO_IFNAME_ENV, ipv4_interfaces  # noqa: E402

# The keys torch's gloo rendezvous writes for the default group: each rank's address.
GLOO_KEYS = ["0//cpu//0/0", "0//cpu//0/1"]


def network_interface() -> str | None:
    """An interface with an IPv4 address beyond loopback, if this machine has one."""
    return next((name for name, address in ipv4_interfaces() if address[0] != 127), None)


def test_a_group_listens_on_loopback_alone_and_its_store_shows_strangers_nothing(monkeypatch):
    # Where the host name resolves to loopback (as here) gloo would choose loopback by luck:
    # point gloo at the network, as a machine whose name resolves to its address does.
    interface = network_interface()
    if interface is not None:
        monkeypatch.setenv(GLOO_IFNAME_ENV, interface)
    with WorkerGroup(2, RankChecks, timeout_s=60) as group:
        assert group.run("whoami")[:2] == (0, 2)
        for pid in (os.getpid(), *group.pids.values()):
            assert beyond_loopback(pid) == [], pid
        stranger = dist.TCPStore(
            "127.0.0.1",
            group.rendezvous_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=2),
        )
        assert not stranger.check(GLOO_KEYS)
        assert group.run("whoami")[:2] == (0, 2)
    assert os.environ.get(GLOO_IFNAME_ENV) == interface  # the caller's setting, restored
