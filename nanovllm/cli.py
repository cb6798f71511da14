"""The `nanovllm` command: one entry point, a subcommand per job.

Each subcommand lives beside the code it drives and is imported only when used, so
`nanovllm --help` is instant and `nanovllm generate` never loads Textual:

    nanovllm generate   stream text from a model (engine/generate_cli.py)
    nanovllm viz        watch the engine work, live (viz/)
    nanovllm serve      an OpenAI-compatible server (serve/)
    nanovllm bench      throughput and latency against peers (bench/)
    nanovllm lesson     the course (lessons/)
    nanovllm microbench the block manager's per-operation cost (core/microbench.py)
    nanovllm stress     step time with 10,000 waiting, and a soak run (engine/stress.py)

A subcommand module provides `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": (
        "nanovllm.engine.generate_cli",
        "stream text from a model (default: the embedded one)",
    ),
    "viz": ("nanovllm.viz.cli", "animate the engine live in the terminal"),
    "serve": ("nanovllm.serve.cli", "run an OpenAI-compatible streaming server"),
    "bench": ("nanovllm.bench.cli", "benchmark nanovllm side by side with its peers"),
    "lesson": ("nanovllm.lessons.cli", "the step-by-step course: list, run and check lessons"),
    "microbench": ("nanovllm.core.microbench", "cost per block allocate / free / cache hit"),
    "stress": ("nanovllm.engine.stress", "step time under a long queue; a soak run with aborts"),
}


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="nanovllm", description="A compact, readable LLM inference engine in vLLM's design."
    )
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
