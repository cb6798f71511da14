"""Modal screens of `nanovllm viz`: the help text and the add-a-request prompt."""

from nanovllm.viz.screens.add_request import AddRequestScreen
from nanovllm.viz.screens.help import HelpScreen

__all__ = ["AddRequestScreen", "HelpScreen"]
