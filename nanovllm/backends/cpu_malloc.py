"""Freed memory kept in the process: glibc malloc's two thresholds, set once by the CPU backend.

A prefill step allocates activations of megabytes and frees them a few operators later
(SmolLM2-135M's gate_up output for a 2,048-token chunk: 2,048 x 3,072 float32 = 25 MB). glibc's
malloc maps a chunk above its *mmap threshold* straight from the kernel and unmaps it when
freed, and gives back free memory above its *trim threshold* at the top of its heap; both start
at 128 KB and rise, by themselves, with the sizes freed. Memory given back to the kernel is
faulted in again, page by page, when the next tensor uses it: that is time in the kernel, in the
middle of the forward pass, while the matmuls wait.

vLLM's CPU backend avoids it by preloading tcmalloc ("to reduce memory allocation overhead",
vllm/platforms/cpu.py); a running process cannot preload an allocator, but it can set glibc's
thresholds (`mallopt`): chunks up to 32 MB (the largest mmap threshold glibc accepts) come from
the heap, and up to 256 MB of free heap stays mapped. Setting either threshold turns off glibc's
adjustment of both, so both are set: one alone was slower than neither.

Measured on the bench's SmolLM2 workload (32 requests, 4,710 prompt tokens in 3 prefill steps,
then 250 decode steps; one thread; minor page faults from `getrusage`): prefill 527k faults and
7.66 s by default, 30.7k and 6.81 s with both thresholds; decode 11.4k and 634 faults, 28.2 and
28.5 s (decode allocates little); only the mmap threshold: 1.07M faults, 9.15 s; only the trim
threshold: 1.49M, 9.44 s.

Costs, stated plainly: the process keeps up to 256 MB of freed memory mapped (its resident size
stays near its peak instead of shrinking after a long prefill), and the setting is the whole
process's, as a preloaded allocator's would be. Only glibc has `mallopt`; elsewhere (musl,
macOS) nothing changes. A threshold the user set in the environment (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`, read by glibc at start-up) is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); whether they were set."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # (mallopt returns 1 on success, 0 for a value it refuses.)
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
