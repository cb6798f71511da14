"""The `nanovllm` command: one entry point, a subcommand per job.

Each subcommand lives beside the code it drives (the measuring tools beside the bench, in
nanovllm/bench/tools/), and the dispatch below imports only the one
being run: `nanovllm --help` imports no subcommand module (checking that one exists imports
just its package's `__init__`), so it loads neither torch nor Textual, and neither does
`import nanovllm` (its public names are lazy, see `__init__.py`). `nanovllm generate` never
loads Textual.

A subcommand module provides `add_arguments(parser)` and `run(args) -> int`; it should import
heavy modules (torch, the engine, Textual) inside `run`, so its `--help` stays fast too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from nanovllm import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": (
        "nanovllm.engine.generate_cli",
        "stream text from a model (default: the embedded one)",
    ),
    "viz": ("nanovllm.viz.cli", "animate the engine live in the terminal"),
    "serve": ("nanovllm.serve.cli", "run an OpenAI-compatible streaming server"),
    "bench": ("nanovllm.bench.cli", "benchmark nanovllm side by side with its peers"),
    "lesson": ("nanovllm.lessons.cli", "the step-by-step course: list, run and check lessons"),
    "microbench": (
        "nanovllm.bench.tools.block_manager",
        "cost per block allocate / free / cache hit",
    ),
    "stress": (
        "nanovllm.bench.tools.stress",
        "step time under a long queue; a soak run with aborts",
    ),
}


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="nanovllm", description="A compact, readable LLM inference engine in vLLM's design."
    )
    parser.add_argument("--version", action="version", version=f"nanovllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            if not _available(module):
                continue
        except ModuleNotFoundError:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:  # import only the subcommand being run
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return int(importlib.import_module(SUBCOMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
