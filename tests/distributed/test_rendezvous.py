"""A tensor-parallel group listens on its address alone, and shows a stranger nothing.

Oracles: the kernel's table of listening sockets (`tests/listeners.py`), and torch's own key
names, which a client of an unprotected rendezvous store reads (a rank's gloo address) and
could write (posing as a rank).
"""

from __future__ import annotations

import datetime
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from rank_checks import RankChecks

sys.path.insert(0, str(Path(__file__).parent.parent))  # for `listeners`
from listeners import beyond_loopback, listening  # noqa: E402

from nanovllm.distributed import WorkerGroup  # noqa: E402
from nanovllm.distributed.rendezvous import GLOO_IFNAME_ENV, ipv4_interfaces  # noqa: E402


def network_interface() -> str | None:
    """An interface with an IPv4 address beyond loopback, if this machine has one."""
    return next((name for name, address in ipv4_interfaces() if address[0] != 127), None)


def stranger_reads(ports: set[int]) -> dict[int, list[str] | None]:
    """The keys a client that knows no secret lists on each port as a rendezvous store's client
    (None: the port does not answer as a store within 2 s). Each asks from a thread of its own:
    a store client talking to a port that is not a store can wait past its own timeout (it is
    left to end when that port closes)."""
    found: dict[int, list[str] | None] = dict.fromkeys(ports)

    def ask(port: int) -> None:
        try:
            timeout = datetime.timedelta(seconds=1)
            stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            found[port] = stranger.list_keys()
        except (RuntimeError, OSError):
            pass

    threads = [threading.Thread(target=ask, args=(port,), daemon=True) for port in ports]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 2
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(found)


@pytest.mark.slow  # (6 s: a two-rank group starts, and strangers wait 2 s)
def test_a_group_listens_on_loopback_alone_and_shows_strangers_no_store(monkeypatch):
    """Every port the group's processes listen on is on loopback, and none answers a stranger
    as a store: the ranks meet at a file in a folder only this user may enter. (Before, the
    store listed `<the group's secret>/0//cpu//0/0`, gloo's address records: a stranger who
    reads them can write under the same name and pose as a rank.)"""
    # Where the host name resolves to loopback (as here) gloo would choose loopback by luck:
    # point gloo at the network, as a machine whose name resolves to its address does.
    interface = network_interface()
    if interface is not None:
        monkeypatch.setenv(GLOO_IFNAME_ENV, interface)
    with WorkerGroup(2, RankChecks, timeout_s=60) as group:
        assert group.run("whoami")[:2] == (0, 2)
        pids = (os.getpid(), *group.pids.values())
        for pid in pids:
            assert beyond_loopback(pid) == [], pid
        ports = {port for pid in pids for _, port in listening(pid)}
        assert stranger_reads(ports) == dict.fromkeys(ports)
        assert stat.S_IMODE(os.stat(group.store_dir).st_mode) == 0o700
        assert group.run("whoami")[:2] == (0, 2)
        store_dir = group.store_dir
    assert not os.path.exists(store_dir)  # closing the group removes its store
    assert os.environ.get(GLOO_IFNAME_ENV) == interface  # the caller's setting, restored
