"""Which `kernels` this process imports: the installed distribution's, or, with none installed,
nothing of ours.

transformers 5 depends on Hugging Face's `kernels` and imports it when it loads a model; a
folder of ours named `kernels` must never stand in for it (README, "The top-level folders").
Child processes that tests start from the repository's root call `check()` (tests/ on their path).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path


def check() -> bool:
    """Assert that `import kernels` is the file the `kernels` distribution installed, or, with
    no such distribution, at most a namespace package (no code of ours runs). Return whether
    the distribution is installed."""
    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        spec = importlib.util.find_spec("kernels")
        assert spec is None or spec.loader is None, spec.origin
        return False
    import kernels

    want = Path(dist.locate_file("kernels/__init__.py")).resolve()
    assert Path(kernels.__file__).resolve() == want, (kernels.__file__, want)
    return True
