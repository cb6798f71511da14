"""A peer's process that ends when the bench does, however the bench ends.

The bench starts peers as child processes. Those it talks to over a pipe (vLLM's worker,
`llamacpp-batched`) see the pipe close when the bench dies and exit. A server it talks to over
HTTP (`llama-server`) does not: killed with SIGKILL, or by a terminal's close, the bench leaves
it running with both cores busy, and every later measurement on the machine is slowed by it.

On Linux a process can ask the kernel for a signal when its parent dies
(`prctl(PR_SET_PDEATHSIG)`): `die_with_parent` asks for SIGKILL, as `preexec_fn` of the child,
between fork and exec (the setting survives exec). Two details:

- "parent" is the thread that forked the child: the bench starts its servers from the thread
  that runs the engines, which lives as long as the bench does;
- the parent may die before the child asks, in which case the child was already adopted by
  another process, and no signal will come: so it checks its parent's pid and exits itself.

Elsewhere (macOS, no `prctl`) it does nothing; the bench's `close()` still stops the server.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # (linux/prctl.h)


def die_with_parent(parent_pid: int) -> None:
    """In the child, before exec: SIGKILL this process when `parent_pid`'s thread exits."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # (not granted: the bench's close() is left)
    if os.getppid() != parent_pid:  # the parent died first: no signal is coming
        os._exit(1)


def preexec_dying_with_this_process():
    """A `preexec_fn` for `subprocess.Popen`: the child dies when this process's thread does."""
    parent_pid = os.getpid()
    return lambda: die_with_parent(parent_pid)
