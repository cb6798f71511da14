"""P2pTransport: one engine's end of a point-to-point KV link between two engine processes.

Disaggregated serving runs prompts on a *producer* engine and decodes on a *consumer* engine;
the prompt's KV crosses between them (`p2p.py`). This module is the wire: torch.distributed
point-to-point `send`/`recv` on a two-rank gloo process group (rank 0 the producer, rank 1 the
consumer), the transport vLLM's P2pNcclConnector uses, with gloo's TCP in place of NCCL. KV
kept on a GPU travels through host memory: it is copied to the CPU before it is sent.

Who connects to whom. The consumer listens on (`kv_ip`, `kv_port`); a producer connects there
whenever it has something to send. Each connection that proves it holds the secret (below)
becomes a *session*: the two ends form a two-rank gloo group and KV flows until either side
dies. Then the consumer waits for the next producer, and a producer reconnects when it next has
something to send. So either engine can be restarted, and one that is down costs the other
nothing but the transfers. Both engines are given the consumer's address (`kv_ip`); each end's
gloo connections use the local address of its connection to the other, so the same flags work
on one machine or two. The port listens on `kv_ip` alone.

Who may connect. Both engines hold the KV secret (`secret.py`). A store such as torch's
`TCPStore` shows every key to whoever connects and takes writes from anyone, so none is exposed:
each connection must first prove it holds the secret, by answering a fresh random challenge
(HMAC-SHA256), and only then does a store exist, private to the pair (`PairStore`: each end
keeps a copy, and writes cross only that authenticated connection). The handshake, on the
connection as it opens:

    consumer -> producer   challenge_c                                 [32 bytes]
    producer -> consumer   challenge_p, HMAC(secret, challenge_c)       [64 bytes]
    consumer -> producer   HMAC(secret, challenge_p) (zeros: refused)  [32 bytes]

A joiner that fails it, or does not finish it within `HANDSHAKE_S`, is dropped; each joiner is
heard on a thread of its own, so a silent one never delays the next, and while a session runs,
another producer (even one holding the secret) is turned away until it ends. The same exchange
runs once more over the gloo group just formed, before any KV crosses: gloo's own connections
are then known to join the two ends that proved themselves, not a stranger who raced to them.

One message after another, in order, on one channel (tag 0):

    BLOCKS  header  int64 [8]: BLOCKS, num_blocks, num_layers, dtype, block_size, heads, dim, len
            names   uint8 [len]: the model tag, then each block's transfer id, one per line
            hashes  uint8 [num_blocks, 32]             the blocks' prefix hashes
            tokens  int64 [num_blocks, block_size]     the blocks' tokens (checked on load)
            layer 0 K, then V: uint8 [num_blocks * block_size * heads * dim * itemsize]
            layer 1 K, V ... (each queued as soon as its layer is saved)
    DONE    header  int64 [8]: DONE, num_blocks_sent, 0, 0, 0, 0, 0, len
            names   uint8 [len]: the model tag, then the transfer id

KV is sent as raw bytes (gloo's send and recv do not take every dtype) and viewed back as the
dtype the header names.

Producer: `send_blocks` and `send_layer`, `send_done`, from the engine thread, only queue; a
sender thread does the sending, so a step never waits on the network. A message queued while no
consumer is connected is dropped (counted in `num_dropped`): its KV is computed on the other
side instead.

Consumer: a receiver thread takes each message into host memory (`inbox`) and records each
transfer's state; the engine thread moves the inbox into its staging area (`p2p.py`) at its own
pace. `wait_for_transfer` / `await_transfer` block until a transfer's DONE arrives, its
connection breaks, or a timeout passes.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import hmac
import logging
import os
import queue
import socket
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nanovllm.distributed.rendezvous import listening_socket
from nanovllm.kv_transfer.secret import sign

logger = logging.getLogger("nanovllm")

BLOCKS, DONE = 1, 2
HEADER_LEN = 8
HASH_LEN = 32  # sha256 (`core/block_hash.py`)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PRODUCER, CONSUMER = 0, 1  # ranks
RECONNECT_S = 0.5  # the pause between failed connection attempts (either end)
FOREVER = datetime.timedelta(days=365)  # a consumer waits for producers (and messages) unboundedly
EXIT_WAIT_S = 0.5  # at exit, how long a closed link's thread is given to leave its group

# Every link of this process. When both ends live in one process (the visualizer's `disagg`
# scenario, the tests), closing the producer drops its group and the consumer's thread then
# leaves its own; if the interpreter tears down meanwhile, gloo aborts the process ("terminate
# called without an active exception"). So at exit each closed link's thread gets a moment to
# end first. One whose producer lives on in another process stays in its call: the bounded wait
# runs out, and the daemon thread is left to the process's end, as before.
_LINKS: weakref.WeakSet[P2pTransport] = weakref.WeakSet()


@atexit.register
def _let_closed_links_end() -> None:
    for link in list(_LINKS):
        if link.closed.is_set():
            for thread in (link.thread, link.session_thread):
                if thread is not None:
                    thread.join(timeout=EXIT_WAIT_S)


MAX_TRANSFERS = 4096  # finished transfers remembered (for a late waiter), oldest forgotten first
HANDSHAKE_S = 5.0  # how long either end waits for the other's answers to its challenge
RENDEZVOUS_S = 30.0  # how long two ends that proved themselves take to form their group
CHALLENGE_LEN = 32
MAX_JOINERS = 64  # connections in their handshake at once; more are closed at once


@dataclass
class ReceivedBlock:
    """One block's KV, received: every layer's K and V, each [block_size, heads, dim]."""

    block_hash: bytes
    token_ids: tuple[int, ...]
    transfer_id: str
    kv: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TransferState:
    """What the consumer knows of one transfer: blocks seen, and how it ended (`error` None and
    `done` True: all arrived)."""

    num_blocks: int = 0
    done: bool = False
    error: str | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=list)


class P2pTransport:
    def __init__(self, ip: str, port: int, rank: int, model_tag: str, secret: str) -> None:
        self.ip, self.port, self.rank, self.model_tag = ip, port, rank, model_tag
        self.secret = secret
        self.num_refused = 0  # consumer: joiners that failed the handshake
        self.session: socket.socket | None = None  # the running session's connection
        self.session_thread: threading.Thread | None = None  # consumer: the one receiving
        self.joiners = threading.BoundedSemaphore(MAX_JOINERS)  # consumer: in their handshake
        self.closed = threading.Event()
        self.connected = threading.Event()
        self.group: dist.ProcessGroup | None = None
        self.num_sessions = 0
        # Producer: messages to send, each a list of tensors (None ends a message early).
        self.outbox: queue.Queue = queue.Queue()
        self.num_dropped = 0  # messages dropped while no consumer was connected
        self.reported_down = False  # warned that no consumer answers (once per outage)
        # Consumer: blocks received, not yet taken by the engine thread; each transfer's state.
        self.lock = threading.Condition()
        self.inbox: list[ReceivedBlock] = []
        self.transfers: OrderedDict[str, TransferState] = OrderedDict()
        # Consumer, the engine thread's alone: received blocks by hash, in LRU order, until a
        # request loads them (`p2p.py` moves the inbox here and bounds it).
        self.staged: OrderedDict[bytes, ReceivedBlock] = OrderedDict()
        if rank == CONSUMER:
            # Bind now, so a port in use is an error at start-up, not a silent thread's death.
            self.listener = listening_socket(ip, port)
            target = self._accept_loop
        else:
            target = self._send_loop
        self.thread = threading.Thread(target=target, name=f"kv-p2p-{rank}", daemon=True)
        self.thread.start()
        _LINKS.add(self)

    def close(self) -> None:
        """Stop sending and receiving, end every wait, and free the consumer's port at once (a
        new engine may listen there); the consumer's accept loop ends. Its session thread
        stays, idle, until its producer leaves or the process exits: tearing down a gloo group
        whose thread is still in a call aborts the process (torch 2.13), so a group is dropped
        only once no call is in it. The producer's thread leaves its group and ends."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.rank == CONSUMER:
            _shut(self.listener)  # (wakes the accept loop, which ends)
        else:
            self.outbox.put(None)  # the sender thread's last item
        with self.lock:
            for tid, state in self.transfers.items():
                if not state.done:
                    self._end(tid, state, "the engine shut down")

    # --- producer ---------------------------------------------------------------------------

    def send_blocks(
        self,
        transfer_ids: list[str],  # each block's
        block_hashes: list[bytes],
        token_ids: list[tuple[int, ...]],
        block_shape: tuple[int, ...],  # (block_size, heads, dim)
        dtype: torch.dtype,
        num_layers: int,
    ) -> None:
        """Queue a BLOCKS message's head; its layers follow with `send_layer`, in order."""
        n = len(block_hashes)
        names = self._names(transfer_ids)
        header = [BLOCKS, n, num_layers, DTYPES.index(dtype), *block_shape, len(names)]
        hashes = torch.frombuffer(bytearray(b"".join(block_hashes)), dtype=torch.uint8)
        tokens = torch.tensor(token_ids, dtype=torch.int64).view(n, -1)
        self.outbox.put((True, [torch.tensor(header), names, hashes.view(n, HASH_LEN), tokens]))

    def send_layer(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Queue one layer's K and V of the message being sent, each [num_blocks, block_size,
        heads, dim] and a tensor of their own (gathered from the cache, which keeps changing)."""
        self.outbox.put((False, [_as_bytes(k), _as_bytes(v)]))

    def send_done(self, transfer_id: str, num_blocks: int) -> None:
        """Queue a transfer's end: the consumer may stop waiting for it."""
        names = self._names([transfer_id])
        header = [DONE, num_blocks, 0, 0, 0, 0, 0, len(names)]
        self.outbox.put((True, [torch.tensor(header), names]))

    def _names(self, transfer_ids: list[str]) -> torch.Tensor:
        data = "\n".join([self.model_tag, *transfer_ids]).encode()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _send_loop(self) -> None:
        # Each item is (starts a message?, tensors). After a failure the rest of the message
        # being sent is dropped: the consumer lost its start with the old connection.
        skipping = False
        next_attempt = 0.0
        while True:
            item = self.outbox.get()
            if item is None:  # closed: leave the group (no call is in it), and end
                self._leave()
                return
            if self.closed.is_set():
                continue
            starts_message, tensors = item
            if starts_message:
                skipping = False
            if skipping:
                continue
            if self.group is None:
                if time.monotonic() < next_attempt or not self._connect_producer():
                    next_attempt = max(next_attempt, time.monotonic() + RECONNECT_S)
                    self.num_dropped += 1
                    skipping = True
                    continue
            try:
                for tensor in tensors:
                    self.group.send([tensor], CONSUMER, 0).wait()
            except RuntimeError as exc:
                reason = str(exc).splitlines()[0][:120]
                logger.warning("nanovllm: KV link to %s:%d broke (%s)", self.ip, self.port, reason)
                self._leave()
                self.num_dropped += 1
                skipping = True

    def _connect_producer(self) -> bool:
        """Connect to the consumer, prove the secret, and form the session's group; False if
        that fails now (the consumer is down, busy with another producer, or refuses us)."""
        try:
            conn = socket.create_connection((self.ip, self.port), timeout=HANDSHAKE_S)
        except OSError as exc:
            self._report_down(str(exc))
            return False
        try:
            if not _producer_handshake(self.secret, *_socket_channel(conn)):
                self._report_down("it refused this engine's KV secret")
                _shut(conn)
                return False
            conn.settimeout(None)
            store = PairStore(conn, RENDEZVOUS_S)
            group = _group(store, PRODUCER, conn.getsockname()[0], RENDEZVOUS_S)
            if not _producer_handshake(self.secret, *_group_channel(group, CONSUMER)):
                raise RuntimeError("it failed the KV secret's challenge on the group")
        except (RuntimeError, OSError, EOFError) as exc:
            self._report_down(str(exc).splitlines()[0][:120] if str(exc) else repr(exc))
            _shut(conn)
            return False
        self.group, self.session = group, conn
        self.num_sessions += 1
        self.connected.set()
        self.reported_down = False
        return True

    def _leave(self) -> None:
        """Producer: drop the session's group and connection."""
        self.group = None
        if self.session is not None:
            _shut(self.session)
            self.session = None
        self.connected.clear()

    def _report_down(self, reason: str) -> None:
        """Warn once per outage, not once per dropped message."""
        if not self.reported_down:
            logger.warning(
                "nanovllm: no KV consumer at %s:%d (%s); transfers are dropped until one answers",
                self.ip,
                self.port,
                reason,
            )
        self.reported_down = True

    # --- consumer ---------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        """Hear each joiner on a thread of its own (`_admit`), so none waits behind another."""
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                if not self.closed.is_set():
                    time.sleep(RECONNECT_S)  # (never a busy loop)
                continue
            if not self.joiners.acquire(blocking=False):
                _shut(conn)  # a flood of joiners: each stays HANDSHAKE_S at most, then room
                continue
            threading.Thread(target=self._admit, args=(conn,), daemon=True).start()

    def _admit(self, conn: socket.socket) -> None:
        """One joiner: the handshake within HANDSHAKE_S; then, if no session runs, its session."""
        try:
            accepted = _consumer_handshake(self.secret, *_socket_channel(conn))
        except (OSError, EOFError):  # silent past the deadline, or gone
            accepted = False
        finally:
            self.joiners.release()
        if not accepted:
            self.num_refused += 1
            logger.warning("nanovllm: KV link refused a joiner: it did not prove the KV secret")
            _shut(conn)
            return
        with self.lock:
            busy = self.closed.is_set() or self.session is not None
            if not busy:
                self.session = conn
        if busy:  # one producer at a time: another retries once this session ends
            _shut(conn)
            return
        self.session_thread = threading.current_thread()
        try:
            self._run_session(conn)
        finally:
            _shut(conn)
            with self.lock:
                self.session = None

    def _run_session(self, conn: socket.socket) -> None:
        """Form the group with the producer that proved itself; receive until it leaves."""
        session = self.num_sessions = self.num_sessions + 1
        try:
            conn.settimeout(None)
            store = PairStore(conn, RENDEZVOUS_S)
            group = _group(store, CONSUMER, conn.getsockname()[0], FOREVER.total_seconds())
            accepted = _consumer_handshake(self.secret, *_group_channel(group, PRODUCER))
        except (RuntimeError, OSError) as exc:
            logger.warning("nanovllm: KV link session %d failed to start: %s", session, exc)
            return
        if not accepted:
            self.num_refused += 1
            logger.warning("nanovllm: KV link session %d refused on its group", session)
            return
        self.group = group
        self.connected.set()
        try:
            while True:
                self._receive_message(group)
        except RuntimeError as exc:
            logger.warning(
                "nanovllm: KV producer disconnected (%s)", str(exc).splitlines()[0][:120]
            )
        self.connected.clear()
        self.group = None
        with self.lock:  # whatever was in flight will not arrive now
            for tid, state in list(self.transfers.items()):
                self._end(tid, state, "the producer disconnected before the transfer ended")

    def _receive_message(self, group: dist.ProcessGroup) -> None:
        header = _recv(group, torch.empty(HEADER_LEN, dtype=torch.int64)).tolist()
        kind, n, num_layers, dtype_code, bs, heads, dim, names_len = header
        names = bytes(_recv(group, torch.empty(names_len, dtype=torch.uint8)).tolist()).decode()
        model_tag, *transfer_ids = names.split("\n")
        if kind == DONE:
            with self.lock:
                self._end(transfer_ids[0], self._state(transfer_ids[0]), None)
            return
        hashes = _recv(group, torch.empty(n, HASH_LEN, dtype=torch.uint8))
        tokens = _recv(group, torch.empty(n, bs, dtype=torch.int64))
        dtype = DTYPES[dtype_code]
        layers = []
        for _ in range(num_layers):
            kv = []
            for _ in range(2):
                raw = torch.empty(n * bs * heads * dim * dtype.itemsize, dtype=torch.uint8)
                kv.append(_recv(group, raw).view(dtype).view(n, bs, heads, dim))
            layers.append(kv)
        with self.lock:
            if self.closed.is_set():
                return
            for i, transfer_id in enumerate(transfer_ids):
                state = self._state(transfer_id)
                if model_tag != self.model_tag:  # another model's KV: received, never used
                    self._end(transfer_id, state, f"the producer serves {model_tag}")
                    continue
                state.num_blocks += 1
                self.inbox.append(
                    ReceivedBlock(
                        bytes(hashes[i].tolist()),
                        tuple(tokens[i].tolist()),
                        transfer_id,
                        [(k[i], v[i]) for k, v in layers],
                    )
                )

    def take_inbox(self) -> list[ReceivedBlock]:
        """The blocks received since the last call (the engine thread's)."""
        with self.lock:
            taken, self.inbox = self.inbox, []
        return taken

    def transfer_error(self, transfer_id: str) -> str | None:
        """How a transfer failed, or None (it arrived, or nothing is known of it)."""
        with self.lock:
            state = self.transfers.get(transfer_id)
            return state.error if state is not None else None

    def wait_for_transfer(self, transfer_id: str, timeout: float) -> str | None:
        """Block until the transfer's DONE has arrived (returns None) or it failed or `timeout`
        seconds passed (returns what happened)."""
        with self.lock:
            state = self._state(transfer_id)
            if not self.lock.wait_for(lambda: state.done, timeout):
                self._end(transfer_id, state, f"its KV did not arrive within {timeout:g} s")
            return state.error

    async def await_transfer(self, transfer_id: str, timeout: float) -> str | None:
        """`wait_for_transfer` for an event loop: waits without holding a thread."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.lock:
            state = self._state(transfer_id)
            if state.done:
                return state.error
            state.waiters.append((loop, future))
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self.lock:
                self._end(transfer_id, state, f"its KV did not arrive within {timeout:g} s")
                return state.error

    def _state(self, transfer_id: str) -> TransferState:
        """(under the lock) A transfer's state, created on first mention."""
        state = self.transfers.get(transfer_id)
        if state is None:
            state = self.transfers[transfer_id] = TransferState()
            while len(self.transfers) > MAX_TRANSFERS:
                self.transfers.popitem(last=False)
        return state

    def _end(self, transfer_id: str, state: TransferState, error: str | None) -> None:
        """(under the lock) The transfer is over, with `error` or not; wake its waiters. The
        first ending counts: a DONE after a timeout changes nothing."""
        if state.done:
            return
        state.done, state.error = True, error
        self.lock.notify_all()
        for loop, future in state.waiters:
            loop.call_soon_threadsafe(_resolve, future, error)
        state.waiters.clear()


class PairStore(dist.Store):
    """The rendezvous store of one session, private to its two ends: each keeps its own copy,
    and every `set` is applied to both, over their connection (authenticated before this store
    exists). Nothing else can list, read or write it. Gloo's rendezvous is all that uses it
    (`set`, `get`, `wait`, `check`).

    On the connection, each `set` is one frame: key length and value length (uint32,
    big-endian), the key (UTF-8), the value."""

    def __init__(self, conn: socket.socket, timeout_s: float) -> None:
        super().__init__()
        self.conn, self.timeout_s = conn, timeout_s
        self.values: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.broken: str | None = None  # why the connection ended, once it has
        threading.Thread(target=self._read, name="kv-pair-store", daemon=True).start()

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        name = key.encode()
        self.conn.sendall(struct.pack("!II", len(name), len(data)) + name + data)
        self._put(key, data)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        with self.changed:
            return all(k in self.values for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        with self.changed:
            self.changed.wait_for(
                lambda: self.broken is not None or all(k in self.values for k in keys), limit
            )
            if not all(k in self.values for k in keys):
                why = self.broken or f"not set within {limit:g} s"
                raise dist.DistStoreError(f"the KV link's rendezvous failed: {keys}: {why}")

    def _put(self, key: str, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def _read(self) -> None:
        """Apply the other end's writes, until the connection ends."""
        try:
            while True:
                key_len, value_len = struct.unpack("!II", _recv_exactly(self.conn, 8))
                key = _recv_exactly(self.conn, key_len).decode()
                self._put(key, _recv_exactly(self.conn, value_len))
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            with self.changed:
                self.broken = f"the connection ended ({exc!r})"
                self.changed.notify_all()


def _shut(sock: socket.socket) -> None:
    """Close `sock` now, waking any thread blocked on it (a plain close would not, on Linux)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut
    sock.close()


def _recv_exactly(conn: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """`n` bytes from `conn`, all by `deadline` (time.monotonic(); None: the socket's own
    timeout). EOFError if the other end closes first; TimeoutError past the deadline."""
    data = bytearray()
    while len(data) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {HANDSHAKE_S:g} s")
            conn.settimeout(left)
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the connection closed")
        data += chunk
    return bytes(data)


Channel = tuple[Callable[[bytes], None], Callable[[int], bytes]]  # (send, receive n bytes)


def _socket_channel(conn: socket.socket) -> Channel:
    """Send and receive on a fresh connection, all of it within HANDSHAKE_S from now."""
    deadline = time.monotonic() + HANDSHAKE_S
    conn.settimeout(HANDSHAKE_S)
    return conn.sendall, lambda n: _recv_exactly(conn, n, deadline)


def _group_channel(group: dist.ProcessGroup, peer: int) -> Channel:
    """Send and receive on a session's group (each receive within HANDSHAKE_S)."""

    def send(data: bytes) -> None:
        group.send([_tensor(data)], peer, 0).wait()

    return send, lambda n: _recv_within(group, peer, n)


def _consumer_handshake(secret: str, send, receive) -> bool:
    """Challenge the producer; answer its challenge only if it passed ours (module docstring).
    Raises when the producer falls silent past the bound, or leaves."""
    challenge_c = os.urandom(CHALLENGE_LEN)
    send(challenge_c)
    reply = receive(2 * CHALLENGE_LEN)
    challenge_p, proof = reply[:CHALLENGE_LEN], reply[CHALLENGE_LEN:]
    accepted = hmac.compare_digest(proof, sign(secret, "kv-producer", challenge_c))
    send(sign(secret, "kv-consumer", challenge_p) if accepted else bytes(CHALLENGE_LEN))
    return accepted


def _producer_handshake(secret: str, send, receive) -> bool:
    """Answer the consumer's challenge, and check its answer to ours (module docstring)."""
    challenge_c = receive(CHALLENGE_LEN)
    challenge_p = os.urandom(CHALLENGE_LEN)
    send(challenge_p + sign(secret, "kv-producer", challenge_c))
    return hmac.compare_digest(receive(CHALLENGE_LEN), sign(secret, "kv-consumer", challenge_p))


def _group(store: dist.Store, rank: int, local_ip: str, timeout_s: float) -> dist.ProcessGroup:
    """A two-rank gloo group whose connections use `local_ip`: the address the peer reaches
    this engine at (gloo's default, the host name's address, may be one the peer cannot
    reach)."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_ip)]
    options._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(store, rank, 2, options)


def _resolve(future: asyncio.Future, error: str | None) -> None:
    if not future.done():
        future.set_result(error)


def _recv(group: dist.ProcessGroup, tensor: torch.Tensor) -> torch.Tensor:
    group.recv([tensor], PRODUCER, 0).wait()
    return tensor


def _recv_within(group: dist.ProcessGroup, src: int, n: int) -> bytes:
    """`n` bytes from `src`, within `HANDSHAKE_S` (else RuntimeError: a silent peer cannot
    hold a session open)."""
    tensor = torch.empty(n, dtype=torch.uint8)
    group.recv([tensor], src, 0).wait(datetime.timedelta(seconds=HANDSHAKE_S))
    return bytes(tensor.tolist())


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes, on the host: [t.numel() * t.element_size()] uint8."""
    return t.to("cpu").contiguous().view(-1).view(torch.uint8)
