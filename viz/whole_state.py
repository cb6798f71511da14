"""`WholeState`: a whole `VizState` as the functions below `state.py` read it.

Some functions read many panels of one state at once: the figures the views show (`figures.py`),
why a request waits (`waiting.py`), a step told in words (`narrative.py`, `story.py`). They sit
below `state.py`, which imports them (to tell each step's story, and to offer the figures beside
the state), so they cannot import `VizState` back. They are typed by this protocol instead: the
read-only fields of a whole state that they read, which `VizState` has. It names the panels'
record types and nothing that reads a whole state, so no import runs back up to `state.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nanovllm.events import EngineStarted
    from nanovllm.viz.blocks import BlockInfo
    from nanovllm.viz.queues import RequestInfo
    from nanovllm.viz.steps import StepRecord
    from nanovllm.viz.tier import TierState


class WholeState(Protocol):
    """The fields of a `VizState` (`state.py`) that the readers of a whole state read."""

    # The engine (`EngineStarted`).
    @property
    def engine(self) -> EngineStarted | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def tensor_parallel_size(self) -> int: ...

    # The queues panel (`queues.py`).
    @property
    def requests(self) -> Mapping[str, RequestInfo]: ...
    @property
    def waiting(self) -> tuple[str, ...]: ...
    @property
    def running(self) -> tuple[str, ...]: ...
    @property
    def families(self) -> Mapping[str, tuple[str, ...]]: ...
    @property
    def waiting_reason(self) -> str | None: ...
    @property
    def waiting_head(self) -> str | None: ...

    # The blocks panel (`blocks.py`).
    @property
    def blocks(self) -> tuple[BlockInfo, ...]: ...
    @property
    def free_queue(self) -> tuple[int, ...]: ...
    @property
    def null_block(self) -> int | None: ...
    @property
    def num_blocks(self) -> int: ...

    # The steps panel (`steps.py`) and the tier panel (`tier.py`).
    @property
    def draft(self) -> StepRecord: ...
    @property
    def last_step(self) -> StepRecord | None: ...
    @property
    def tier(self) -> TierState: ...
