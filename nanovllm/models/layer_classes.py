"""LayerClasses: what the decoder asks of the classes it builds its layers from.

The decoder (`llama.py`) names no class of its layers: it is given them (`model_layers.py`'s
`ModelLayers`, a backend's or a lesson's), each called as its plain counterpart in `llama.py`
and beside it. This is that contract, kept apart from `ModelLayers` (which imports the decoder's
own classes) so that the decoder can name it without importing its own builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import nn


class LayerClasses(Protocol):
    """The classes the decoder builds its layers from (see the module docstring)."""

    attention: Callable[..., nn.Module]
    qkv: Callable[..., nn.Module]
    merged_column: Callable[..., nn.Module]
    row: Callable[..., nn.Module]
    embedding: Callable[..., nn.Module]
    lm_head: Callable[..., nn.Module]
    self_attn: Callable[..., nn.Module]
    rms_norm: Callable[..., nn.Module]
    rotary: Callable[..., nn.Module]
    decoder_layer: Callable[..., nn.Module]
    moe: Callable[..., nn.Module]
