"""A scenario's model derived from the embedded one, written once into the temporary directory.

Some scenarios show what the embedded model cannot (sliding windows, experts): each writes the
embedded model's weights out again as another architecture. The folder is named after the
embedded weights (size and modification time) and the variant, so a changed model or variant
is written anew; it is built in a folder of its own and renamed into place, so a process never
reads a half-written one, and two processes building it at once both end with the same folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def derived_model_path(name: str, variant: str, write: Callable[[Path, Path], None]) -> Path:
    """The folder of the embedded model rewritten by `write(source, out)` (built once); `name`
    and `variant` name the folder."""
    from nanovllm.engine.setup import default_model_path

    source = default_model_path()
    weights = source / "model.safetensors"
    stamp = f"{weights.stat().st_size}-{int(weights.stat().st_mtime)}-{variant}"
    target = Path(tempfile.gettempdir()) / f"nanovllm-viz-{name}-{os.getuid()}-{stamp}"
    if (target / "model.safetensors").exists():
        return target
    building = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    write(source, building)
    try:
        building.rename(target)
    except OSError:  # (another process built it first)
        shutil.rmtree(building, ignore_errors=True)
    return target
