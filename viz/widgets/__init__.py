"""The views of `nanovllm viz`: one small widget per file, each drawing one part of a `VizState`.

Every view is a `StateView`: the app hands it each new state with `show()`, and it redraws only
when the parts of the state it draws have changed (an identity check, since states are
immutable). None of them knows about the engine, the worker or each other.
"""

from nanovllm.viz.widgets.base import StateView
from nanovllm.viz.widgets.block_tables import BlockTablesView
from nanovllm.viz.widgets.executor import ExecutorView
from nanovllm.viz.widgets.experts import ExpertsView
from nanovllm.viz.widgets.free_queue import FreeQueueView
from nanovllm.viz.widgets.kv_cache import KVCacheView
from nanovllm.viz.widgets.link import LinkView
from nanovllm.viz.widgets.metrics import MetricsView
from nanovllm.viz.widgets.narrative import NarrativeView
from nanovllm.viz.widgets.paging import PagingView
from nanovllm.viz.widgets.queues import QueuesView
from nanovllm.viz.widgets.request_text import RequestTextView
from nanovllm.viz.widgets.status_bar import StatusBar
from nanovllm.viz.widgets.step_view import StepView
from nanovllm.viz.widgets.tier import TierView
from nanovllm.viz.widgets.timeline import TimelineView

__all__ = [
    "BlockTablesView",
    "ExecutorView",
    "ExpertsView",
    "FreeQueueView",
    "KVCacheView",
    "LinkView",
    "MetricsView",
    "NarrativeView",
    "PagingView",
    "QueuesView",
    "RequestTextView",
    "StateView",
    "StatusBar",
    "StepView",
    "TierView",
    "TimelineView",
]
