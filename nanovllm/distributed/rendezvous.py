"""Listening only where told: a rendezvous store and gloo connections bound to one address.

Processes that form a torch.distributed group first meet at a rendezvous store (a `TCPStore`
one of them hosts), then open gloo's own connections to each other. Left to themselves, both
listen beyond the address they were given: TCPStore's server binds every interface, and gloo
binds the address the machine's host name resolves to (usually its network address). A group
started on 127.0.0.1 would then be open to the whole network.

- `listening_store(host, port)`: the store's server on a socket we bound to `host` ourselves
  (TCPStore's `master_listen_fd`), so it listens there and nowhere else; `stop_listening`
  frees its port while threads still wait in the store;
- `gloo_bound_to(host)`: gloo groups created inside it listen on the interface holding `host`
  (gloo's `GLOO_SOCKET_IFNAME`, set for the duration only).

Who may join is the callers' business. A TCPStore shows every key to whoever connects
(`list_keys`) and takes writes from anyone, so neither caller exposes one: the tensor-parallel
group meets at a file store in a private folder (`worker_group.py`), and the KV link
authenticates each connection before any store exists (`kv_transfer/p2p_transport.py`).
`listening_store` remains for a group started by hand across machines (`init_distributed` with
a port).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
SIOCGIFADDR = 0x8915  # Linux's ioctl: an interface's IPv4 address


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` alone (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted process rebinds its port at once (old connections in TIME_WAIT).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def listening_store(host: str, port: int, timeout: datetime.timedelta) -> tuple[dist.TCPStore, int]:
    """A TCPStore server listening on `host`:`port` alone (port 0: a free one, see `.port`),
    and its listening socket's file descriptor (for `stop_listening`)."""
    sock = listening_socket(host, port)
    try:
        store = dist.TCPStore(
            host,
            sock.getsockname()[1],
            None,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    return store, sock.detach()  # the store owns the socket now, and closes it when destroyed


def stop_listening(fd: int) -> None:
    """Free a `listening_store`'s port now, although threads still wait in the store (TCPStore
    stops its server only when it is destroyed). A fresh, unbound socket takes the listening
    one's descriptor: the kernel closes the listening socket, which leaves the store's event
    loop with it, and the store's established connections are untouched."""
    with socket.socket() as placeholder:
        os.dup2(placeholder.fileno(), fd)


def ipv4_interfaces() -> Iterator[tuple[str, bytes]]:
    """Each network interface with an IPv4 address: (name, the address's 4 bytes). Linux's
    ioctl; nothing elsewhere."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                yield name, fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)[20:24]
            except OSError:
                continue  # an interface with no IPv4 address


def interface_of(host: str) -> str | None:
    """The network interface whose IPv4 address is `host`'s, or None (not found, IPv6, or a
    system without Linux's ioctl)."""
    try:
        target = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        return None
    return next((name for name, address in ipv4_interfaces() if address == target), None)


@contextmanager
def gloo_bound_to(host: str) -> Iterator[None]:
    """Gloo groups created inside this block listen on `host`'s interface (loopback for
    127.0.0.1), whatever the host name resolves to."""
    interface = interface_of(host)
    saved = os.environ.get(GLOO_IFNAME_ENV)
    if interface is not None:
        os.environ[GLOO_IFNAME_ENV] = interface
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(GLOO_IFNAME_ENV, None)
        else:
            os.environ[GLOO_IFNAME_ENV] = saved
