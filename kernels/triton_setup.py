"""The one place that decides how Triton kernels run: compiled for a GPU, or interpreted on the CPU.

Triton compiles `@triton.jit` functions to GPU machine code. Without a GPU it can still *run* them
through its interpreter, which executes each program in Python with NumPy standing in for the GPU:
thousands of times slower, but exact enough to test kernels on a laptop or a CI box.

Which of the two a kernel gets is read from the environment variable `TRITON_INTERPRET`, and
it is read at decoration time: when `@triton.jit` runs, i.e. when a kernel module is imported.
That includes Triton's *own* `@triton.jit` library functions (`tl.sum`, `tl.max`, `tl.cdiv`,
`tl.zeros`, ...), which are decorated when `triton` itself is first imported. So every kernel
module in this package starts with::

    from nanovllm.kernels import triton_setup

    triton_setup.configure()  # must run before `import triton`
    import triton

and `configure()` applies one rule:

- `TRITON_INTERPRET` already set (to anything): respect it. `TRITON_INTERPRET=0` on a machine with
  no GPU is how `compile_check` compiles the kernels ahead of time for a GPU it does not have.
- otherwise: interpret when torch sees no CUDA device, compile when it does.

Often `triton` has been imported already: loading a Hugging Face model imports `torch._dynamo`,
which imports `triton`, before anyone thought of the interpreter. Our own kernels are decorated
later, so they still follow the rule, but Triton's library functions were decorated for the
compiler, and an interpreted kernel cannot call them. `configure()` repairs this: it re-wraps each
of those library functions for the interpreter, as an import after the setting would have done.
(Only in a process that interprets, where no compiled Triton kernel can run anyway.) Anything it
cannot repair, e.g. a library decorated for the interpreter in a process that now wants to
compile, raises a RuntimeError that says what to do instead of running kernels in the wrong mode.

Triton ships wheels for Linux x86_64 only; `triton_available()` says whether it can be imported,
and `configure()` raises an ImportError naming the plain-torch fallback when it cannot.
"""

from __future__ import annotations

import importlib.util
import os

_ENV = "TRITON_INTERPRET"

# The decision, once made: True = interpreter, False = compiled. None until `configure()` runs.
_interpreted: bool | None = None


def triton_available() -> bool:
    """Whether `import triton` would succeed (it is only installed on Linux x86_64)."""
    return importlib.util.find_spec("triton") is not None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _env_says_interpret() -> bool:
    return os.environ.get(_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def _triton_decorates_as_interpreted() -> bool:
    """Ask Triton itself: does `@triton.jit` now produce an interpreted function?"""
    import triton

    def _probe(x):  # never called; only decorated
        pass

    return type(triton.jit(_probe)).__name__ == "InterpretedFunction"


def _triton_library_is_interpreted() -> bool:
    """Were Triton's own @jit library functions decorated for the interpreter?"""
    import triton.language as tl

    return type(tl.cdiv).__name__ == "InterpretedFunction"


def _make_triton_library_interpretable() -> None:
    """Re-wrap Triton's @jit library functions (tl.sum, tl.max, tl.cdiv, ...) for the interpreter.

    They were decorated as compiler functions because `triton` was imported before
    TRITON_INTERPRET=1 was set. Every place that holds one (the triton.language modules, and the
    tensor class for the `x.sum()` spellings) gets the same interpreted replacement, so the
    interpreter's identity checks (`combine_fn is tl.standard._sum_combine`, which turn reductions
    into NumPy calls) still hold.
    """
    import sys

    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    replacement: dict[int, InterpretedFunction] = {}
    namespaces = [m for name, m in list(sys.modules.items()) if name.startswith("triton.language")]
    namespaces.append(tl.core.tensor)
    for namespace in namespaces:
        for name, obj in list(vars(namespace).items()):
            if isinstance(obj, JITFunction):
                if id(obj) not in replacement:
                    replacement[id(obj)] = InterpretedFunction(obj.fn)
                setattr(namespace, name, replacement[id(obj)])


def configure() -> bool:
    """Choose interpreter vs compiled (see the module docstring); return True if interpreted.

    Idempotent: the first call decides, later calls return the same answer.
    """
    global _interpreted
    if _interpreted is not None:
        return _interpreted
    if not triton_available():
        raise ImportError(
            "triton is not installed (it ships for Linux x86_64 only); the Triton kernels in "
            "nanovllm.kernels cannot run here. Use the plain-torch references in "
            "nanovllm.kernels.reference instead."
        )
    if _ENV not in os.environ and not _cuda_available():
        os.environ[_ENV] = "1"
    wanted = _env_says_interpret()
    mode = {True: "interpreted", False: "compiled"}
    if _triton_decorates_as_interpreted() != wanted:
        raise RuntimeError(
            f"Triton would decorate kernels {mode[not wanted]}, but {_ENV}="
            f"{os.environ.get(_ENV)!r} asks for {mode[wanted]}: something changed Triton's "
            "interpreter setting in code (e.g. triton.knobs.runtime.interpret). Set "
            f"{_ENV} in the environment before starting Python instead."
        )
    if _triton_library_is_interpreted() != wanted:
        if not wanted:
            raise RuntimeError(
                f"triton was imported with {_ENV}=1, but this process now asks for compiled "
                f"kernels ({_ENV}={os.environ.get(_ENV)!r}). Set {_ENV} before starting Python."
            )
        _make_triton_library_interpretable()
    _interpreted = wanted
    return _interpreted


def is_interpreted() -> bool:
    """True when the kernels run in Triton's CPU interpreter, False when compiled for a GPU."""
    return configure()
