"""N ranks of one model: rank 0 in this (the driver) process, ranks 1..N-1 in worker processes.

Tensor parallelism needs one process per rank. The engine (scheduler, KV cache manager) stays
single, in the driver process, which is also rank 0: each step it calls a method on its own
worker object and, through one broadcast, on every other rank's worker, which all run their
shard of the forward pass together (their all-reduces meet in the middle).

    group = WorkerGroup(2, make_worker)        # make_worker(rank) builds a rank's worker
    out = group.run("execute_model", inputs)   # rank 0's result; every rank ran it
    times = group.run_all("forward_time")      # every rank's result, in rank order
    group.close()                              # or `with WorkerGroup(...) as group:`

`make_worker` must be picklable (a module-level function or class), since worker processes are
started with the "spawn" method: a fresh interpreter, which is what CUDA requires.

Faults end the group, never hang it:
- A worker that exits (crash, kill, or an exception in its method, whose traceback it sends
  back first) is seen by a monitor thread watching every worker's process sentinel. The monitor
  kills the remaining workers, which breaks the driver out of any collective it was waiting in;
  `run` then raises `WorkerDiedError` naming the rank that died first and why.
- A rank that stops answering without exiting is caught by the process group's timeout
  (`timeout_s`): the driver's collective raises, and the group is closed.
- If the driver process dies, every worker's pipe to it reaches end-of-file and the worker
  exits: no orphans.
`close()` (also run at interpreter exit) asks the workers to stop, waits for them, and kills
any that do not.

Under torchrun, where every rank is started by torchrun on one machine or many, call
`WorkerGroup.from_torchrun(make_worker)` in every process: on rank 0 it returns the group; on
the other ranks it serves rank 0 until the group closes, then exits the process.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from nanovllm.distributed.communication import (
    broadcast_tensor_dict,
    gather_object,
)
from nanovllm.distributed.parallel_state import (
    DEFAULT_TIMEOUT_S,
    destroy_distributed,
    get_parallel_state,
    init_distributed,
    init_distributed_from_env,
)
from nanovllm.distributed.validation import check_device_count

_METHOD, _ARGS, _ALL = "__method__", "__args__", "__all_ranks__"
_SHUTDOWN = "__shutdown__"


class WorkerGroupError(RuntimeError):
    """The group failed (a collective timed out, or it is closed) and can no longer run."""


class WorkerDiedError(WorkerGroupError):
    """A worker process exited; `rank` says which, `reason` how (exit code or its traceback)."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"tensor-parallel rank {rank} died: {reason}")
        self.rank, self.reason = rank, reason


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def serve_driver(worker: Any) -> None:
    """A non-driver rank's loop: run each method rank 0 broadcasts, until it says stop."""
    while True:
        message = broadcast_tensor_dict(src=0)
        method = message.pop(_METHOD)
        if method == _SHUTDOWN:
            return
        all_ranks = message.pop(_ALL)
        args = message.pop(_ARGS)
        result = getattr(worker, method)(*args, **message)
        if all_ranks:
            gather_object(result, dst=0)


def _exit_when_driver_gone(death_pipe: connection.Connection) -> None:
    """Block until the driver closes its end of the pipe (or dies), then exit at once."""
    try:
        death_pipe.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (once per process) with the process's own stderr.

    The first spawn starts the tracker and hands it the file descriptor of `sys.stderr`. A
    program that replaced `sys.stderr` with an object whose `fileno()` is -1 (Textual's capture
    inside a running app) would make every spawn fail with "bad value(s) in fds_to_keep".
    """
    from multiprocessing import resource_tracker

    replaced, sys.stderr = sys.stderr, sys.__stderr__
    try:
        resource_tracker.ensure_running()
    finally:
        sys.stderr = replaced


def _worker_main(
    rank: int,
    world_size: int,
    master_addr: str,
    store_path: str,
    device_type: str,
    timeout_s: float,
    worker_factory: Callable[[int], Any],
    status: connection.Connection,
    death_pipe: connection.Connection,
) -> None:
    """A worker process: join the group, build this rank's worker, serve the driver."""
    # SIGUSR1 prints every thread's stack: the driver sends it to a rank that misses a start-up
    # deadline, so the error says where that rank waits, not only that it did.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threading.Thread(target=_exit_when_driver_gone, args=(death_pipe,), daemon=True).start()
    try:
        status.send(("started", None))
        init_distributed(
            rank,
            world_size,
            master_addr,
            device_type=device_type,
            timeout_s=timeout_s,
            store=dist.FileStore(store_path, world_size),
        )
        worker = worker_factory(rank)
        status.send(("ready", None))
        serve_driver(worker)
    except BaseException:
        try:
            status.send(("error", traceback.format_exc()))
        except OSError:
            pass  # the driver is gone
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: the process group's destructor may abort on exit


class WorkerGroup:
    """Rank 0 here, ranks 1..world_size-1 in spawned processes; see the module docstring."""

    def __init__(
        self,
        world_size: int,
        worker_factory: Callable[[int], Any],
        *,
        device_type: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_TIMEOUT_S,
        master_addr: str = "127.0.0.1",
    ) -> None:
        """Start ranks 1..world_size-1 and build every rank's worker with `worker_factory(rank)`.

        `timeout_s` bounds every collective (a rank silent for longer fails the group);
        `start_timeout_s` bounds each start-up phase (a worker starting its interpreter, and
        building its worker, which may load a model). On CUDA, rank r uses GPU r.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        check_device_count(world_size, device_type)  # before any process starts
        if world_size > 1 and get_parallel_state() is not None:
            raise WorkerGroupError(
                "this process is already rank 0 of a tensor-parallel group; close that "
                "WorkerGroup first (a process can belong to one group at a time)"
            )
        self._init_state(world_size, timeout_s)
        self.start_timeout_s = start_timeout_s
        try:
            self._start(worker_factory, device_type, master_addr)
        except BaseException as exc:
            self._broken = True
            failure = self._find_dead_worker(grace_s=0.5)
            self.close()
            if failure is not None:
                raise failure from exc
            raise

    @classmethod
    def from_torchrun(
        cls,
        worker_factory: Callable[[int], Any],
        *,
        device_type: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> WorkerGroup:
        """Join the group torchrun set up. Returns on rank 0; other ranks serve, then exit.

        Every process runs the same script. On one machine:
            torchrun --standalone --nproc-per-node 2 script.py
        On two machines, 2 ranks each (the same command on both, HOST being the first):
            torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
                --rdzv-endpoint HOST:29400 script.py
        or with a static rendezvous: `--nnodes 2 --node-rank 0|1 --master-addr HOST
        --master-port 29500`. (All three were run on one host, as two "nodes" for the latter
        two; on CPU with gloo.)

        Ranks on other machines cannot be watched as processes, so a dead rank shows up as a
        collective that fails or times out (`WorkerGroupError`), not as `WorkerDiedError`.
        """
        state = init_distributed_from_env(device_type=device_type, timeout_s=timeout_s)
        if state.rank != 0:
            serve_driver(worker_factory(state.rank))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        group = cls.__new__(cls)
        group._init_state(state.world_size, timeout_s)
        group.driver_worker = worker_factory(0)
        return group

    def _init_state(self, world_size: int, timeout_s: float) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._processes: dict[int, mp.Process] = {}
        self._status: dict[int, connection.Connection] = {}
        self._death_pipes: list[connection.Connection] = []
        self._deaths: dict[int, WorkerDiedError] = {}  # why each dead rank died
        self._failure: WorkerDiedError | None = None  # the first death the monitor saw
        self._failed = threading.Event()
        self._broken = False  # a call failed: the ranks are out of step
        self._closed = False
        self._monitor: threading.Thread | None = None
        self._stop_monitor_r = self._stop_monitor_w = None
        self.store_dir: str | None = None  # the rendezvous store's private folder (rank > 1)
        atexit.register(self.close)

    # ----- start-up -----

    def _start(self, worker_factory, device_type: str, master_addr: str) -> None:
        if self.world_size == 1:
            self.driver_worker = worker_factory(0)
            return
        # The ranks meet at a store that is a file in a folder only this user may enter (mkdtemp:
        # mode 0700), its path handed to each rank in its spawn arguments. No port is opened for
        # it, so nothing on the network can list, read or write the keys the ranks rely on
        # (gloo's addresses): the store is private to the processes this group started.
        self.store_dir = tempfile.mkdtemp(prefix="nanovllm-tp-")
        store_path = os.path.join(self.store_dir, "store")
        store = dist.FileStore(store_path, self.world_size)
        ctx = mp.get_context("spawn")
        _start_resource_tracker()
        for rank in range(1, self.world_size):
            status_r, status_w = ctx.Pipe(duplex=False)
            death_r, death_w = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_worker_main,
                args=(
                    rank,
                    self.world_size,
                    master_addr,
                    store_path,
                    device_type,
                    self.timeout_s,
                    worker_factory,
                    status_w,
                    death_r,
                ),
                name=f"nanovllm-tp-rank{rank}",
                daemon=True,
            )
            process.start()
            status_w.close()  # the worker's ends: closing ours lets EOF mean "gone"
            death_r.close()
            self._processes[rank] = process
            self._status[rank] = status_r
            self._death_pipes.append(death_w)
        self._await_all("started")
        init_distributed(
            0,
            self.world_size,
            master_addr,
            device_type=device_type,
            timeout_s=self.timeout_s,
            store=store,
        )
        self.driver_worker = worker_factory(0)
        self._await_all("ready")
        self._stop_monitor_r, self._stop_monitor_w = ctx.Pipe(duplex=False)
        self._monitor = threading.Thread(target=self._watch, name="tp-monitor", daemon=True)
        self._monitor.start()

    def _await_all(self, what: str) -> None:
        """Wait until every worker has sent `what`, raising if one dies or reports an error."""
        deadline = time.monotonic() + self.start_timeout_s
        waiting = set(self._processes)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                if what != "started":  # a rank that has not started has no handler for it yet
                    self._show_stacks(waiting)
                raise WorkerGroupError(
                    f"ranks {sorted(waiting)} did not become {what!r} within {self.start_timeout_s} s"
                )
            conns = [self._status[r] for r in waiting]
            sentinels = [self._processes[r].sentinel for r in waiting]
            for ready in connection.wait(conns + sentinels, timeout=left):
                rank = next(
                    r
                    for r in self._processes
                    if ready in (self._status[r], self._processes[r].sentinel)
                )
                if rank not in waiting:
                    continue  # its message and its sentinel were both ready
                if ready is self._status[rank]:
                    try:
                        kind, detail = self._status[rank].recv()
                    except (EOFError, OSError):
                        kind, detail = "gone", None
                    if kind == what:
                        waiting.discard(rank)
                        continue
                    if kind == "error":
                        self._processes[rank].join(timeout=5)
                        self._deaths[rank] = WorkerDiedError(rank, f"it raised\n{detail}")
                raise self._death_of(rank)

    def _show_stacks(self, ranks: set[int]) -> None:
        """Ask each of `ranks` to print its threads' stacks to its stderr (see `_worker_main`)."""
        for rank in ranks:
            try:
                os.kill(self._processes[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass  # gone already, or never started
        time.sleep(1.0)  # the stacks are written by the ranks themselves

    # ----- faults -----

    def _death_of(self, rank: int) -> WorkerDiedError:
        """Why `rank` died (or is about to): its traceback if it sent one, else its exit."""
        if rank not in self._deaths:
            reason = None
            status = self._status[rank]
            try:
                while reason is None and status.poll():
                    kind, detail = status.recv()
                    if kind == "error":
                        reason = f"it raised\n{detail}"
            except (EOFError, OSError):
                pass  # it exited without a word
            process = self._processes[rank]
            process.join(timeout=5)
            self._deaths[rank] = WorkerDiedError(rank, reason or _describe_exit(process.exitcode))
        return self._deaths[rank]

    def _watch(self) -> None:
        """Monitor thread: on the first worker exit, record why and kill the others."""
        sentinels = {p.sentinel: r for r, p in self._processes.items()}
        ready = connection.wait([*sentinels, self._stop_monitor_r])
        if self._stop_monitor_r in ready or self._closed:
            return
        rank = min(sentinels[s] for s in ready if s in sentinels)
        self._failure = self._death_of(rank)
        self._failed.set()
        self._kill_workers()

    def _find_dead_worker(self, grace_s: float) -> WorkerDiedError | None:
        """The worker death behind a failed collective, waiting up to grace_s for it to show."""
        if self._monitor is not None:
            self._failed.wait(grace_s)
            return self._failure
        dead = [r for r, p in self._processes.items() if not p.is_alive()]
        if not dead and self._processes:
            connection.wait([p.sentinel for p in self._processes.values()], timeout=grace_s)
            dead = [r for r, p in self._processes.items() if not p.is_alive()]
        return self._death_of(min(dead)) if dead else None

    def _kill_workers(self) -> None:
        for process in self._processes.values():
            if process.is_alive():
                process.kill()
        for process in self._processes.values():
            process.join(timeout=5)

    # ----- running -----

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on every rank's worker with the same arguments; return rank 0's result.

        The arguments travel once, from rank 0 to all others (`broadcast_tensor_dict`: CPU
        tensors and objects pickled together, GPU tensors passed as keyword arguments go
        through the device group).
        """
        return self._call(method, args, kwargs, all_ranks=False)

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Like `run`, but return every rank's result, in rank order (gathered to rank 0)."""
        return self._call(method, args, kwargs, all_ranks=True)

    def _call(self, method: str, args: tuple, kwargs: dict, all_ranks: bool) -> Any:
        if self._closed:
            raise WorkerGroupError("the worker group is closed")
        if self.world_size == 1:
            result = getattr(self.driver_worker, method)(*args, **kwargs)
            return [result] if all_ranks else result
        try:
            if self._failure is not None:
                raise self._failure
            broadcast_tensor_dict({_METHOD: method, _ALL: all_ranks, _ARGS: args, **kwargs})
            result = getattr(self.driver_worker, method)(*args, **kwargs)
            return gather_object(result, dst=0) if all_ranks else result
        except BaseException as exc:
            # Any failure leaves the ranks out of step: the group cannot go on.
            self._broken = True
            failure = self._find_dead_worker(grace_s=0.5)
            self.close()
            if failure is not None and failure is not exc:
                raise failure from exc
            if isinstance(exc, RuntimeError) and failure is None and _is_collective_error(exc):
                raise WorkerGroupError(
                    f"a collective failed with every worker alive (timeout {self.timeout_s} s): "
                    f"{exc}"
                ) from exc
            raise

    # ----- closing -----

    @property
    def closed(self) -> bool:
        """Whether the group has stopped (closed, or after any failure): it runs nothing more."""
        return self._closed

    def close(self) -> None:
        """Stop every rank and leave the process group. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._stop_monitor_w is not None:
            self._stop_monitor_w.send(None)
            self._monitor.join(timeout=5)
        healthy = (
            not self._broken
            and self._failure is None
            and all(p.is_alive() for p in self._processes.values())
        )
        if self.world_size > 1 and healthy and get_parallel_state() is not None:
            try:
                broadcast_tensor_dict({_METHOD: _SHUTDOWN})
                deadline = time.monotonic() + 5  # a clean exit takes milliseconds
                for process in self._processes.values():
                    process.join(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                pass  # a worker died meanwhile; it is killed below
        self._kill_workers()  # after a failure, at once: the ranks are out of step
        for conn in [*self._death_pipes, *self._status.values()]:
            conn.close()
        for conn in (self._stop_monitor_r, self._stop_monitor_w):
            if conn is not None:
                conn.close()
        destroy_distributed()
        if self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def failure(self) -> WorkerDiedError | None:
        """The first worker death the monitor saw (None while every rank lives): the group
        cannot run again once it is set. A server's health check reads it between steps."""
        return self._failure

    @property
    def pids(self) -> dict[int, int]:
        """The process id of each worker rank (1..world_size-1)."""
        return {rank: p.pid for rank, p in self._processes.items()}


def _is_collective_error(exc: BaseException) -> bool:
    """torch.distributed's failures: a timeout, a closed connection, a backend error."""
    return isinstance(exc, dist.DistError) or "gloo" in str(exc) or "NCCL" in str(exc)
