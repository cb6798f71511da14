"""OpenMP's wait policy: on a CPU, a thread with nothing left to do sleeps instead of spinning.

torch's matmuls and the CPU attention kernel run on OpenMP thread pools (two of them: torch's
wheel brings its own libgomp, numba's threading layer links the system's; kernels/README.md,
Threads). By default a libgomp worker that finishes its share of a parallel region spins for a
while before it sleeps, so that the next region finds it awake. That pays only when every
worker has a core of its own. A decode step runs hundreds of short regions one after another,
and when another process (or the other pool) holds a core, the spinning worker burns the time
slice the descheduled one needs to finish the region, and every region waits for it: on this
2-core machine under load, one run of 8 requests took 121-181 s by default and 17-36 s with
the workers sleeping (kernels/README.md, Threads).

`OMP_WAIT_POLICY=PASSIVE` makes libgomp's workers sleep at once. libgomp reads it once, when
it is loaded, that is when torch is first imported, so it is set here, from `import nanovllm`,
before nanovllm imports torch; the process's children (tensor-parallel workers) inherit it.
A value the user set (`OMP_WAIT_POLICY`, or libgomp's `GOMP_SPINCOUNT`) is kept. When torch
was imported before nanovllm, the policy can no longer change and one notice says so.
Another program this process starts (a peer engine in the bench) gets the environment without
the policy set here (`environ_for_others`), so it runs as its own defaults say.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

POLICY = "PASSIVE"
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_set_here = False  # whether `apply` set OMP_WAIT_POLICY in this process


def apply(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Set `OMP_WAIT_POLICY` to PASSIVE unless the user chose a wait policy. Returns what
    happened: "set", "kept" (the user's), "late" (torch already loaded: told once)."""
    if any(name in environ for name in USER_SETTINGS):
        return "kept"
    if "torch" in sys.modules:
        logger.warning(
            "nanovllm: torch was imported before nanovllm, so its OpenMP threads keep spinning "
            "while they wait, which is slow when other work shares the CPU; import nanovllm "
            "first or set OMP_WAIT_POLICY=PASSIVE"
        )
        _set(environ)  # (for the processes this one starts)
        return "late"
    _set(environ)
    return "set"


def _set(environ: dict[str, str] | os._Environ) -> None:
    global _set_here
    environ["OMP_WAIT_POLICY"] = POLICY
    _set_here = _set_here or environ is os.environ


def environ_for_others() -> dict[str, str]:
    """This process's environment without the wait policy `apply` set (the user's is kept)."""
    env = dict(os.environ)
    if _set_here:
        env.pop("OMP_WAIT_POLICY", None)
    return env
