"""Which TCP ports a process listens on, and at which address (Linux: /proc/net/tcp{,6}).

The oracle of the "listen only where told" tests: the kernel's own table of listening sockets,
matched to a process through the socket inodes among its open file descriptors. An address of
0.0.0.0 or :: means every interface.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

LISTEN = "0A"  # the TCP state code of a listening socket


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket that process `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN or fields[9] not in inodes:
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # The kernel prints each 32-bit word in host (little-endian) order.
            words = [raw[i : i + 4][::-1] for i in range(0, width, 4)]
            address = ipaddress.ip_address(b"".join(words))
            found.append((str(getattr(address, "ipv4_mapped", None) or address), int(hex_port, 16)))
    return found


def beyond_loopback(pid: int) -> list[tuple[str, int]]:
    """The listening sockets of `pid` reachable from another machine (not on loopback)."""
    return [(a, p) for a, p in listening(pid) if not ipaddress.ip_address(a).is_loopback]
