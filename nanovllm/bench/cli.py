"""`nanovllm bench`: the command line over `suite.run`, with rich progress bars.

    nanovllm bench                                  # embedded model, all engines, 64 requests
    nanovllm bench --model embedded,100m --plot bench.png --json bench.json
    nanovllm bench --quick                          # a seconds-long smoke run on a micro model
    nanovllm bench --engines nanovllm,vllm --vllm-python /work/vllm-venv/bin/python
    nanovllm bench --request-rate 8                 # online: Poisson arrivals, 8 req/s
    nanovllm bench --profile                        # + where nanovllm's step time goes

Progress and tables go to stderr/stdout through rich; `--json -` prints the JSON document
alone on stdout (tables then go to stderr), `--json FILE` writes it to a file.
"""

from __future__ import annotations

import argparse
import sys

from nanovllm.bench.workload import parse_range

QUICK = dict(
    models=["micro"],
    engines=["nanovllm", "hf-static", "hf-cb", "one-at-a-time"],
    num_requests=8,
    prompt_len=(8, 32),
    output_len=(8, 16),
    repeats=1,
    hf_batch_sizes=[4, 8],
    prefix_len=32,
    warmup_requests=2,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nanovllm.bench.suite import ALL_ENGINES, DEFAULT_ENGINES

    w = parser.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=None, help="default 64")
    w.add_argument("--prompt-len", default=None, help="LO:HI prompt tokens (default 32:256)")
    w.add_argument("--output-len", default=None, help="LO:HI output tokens (default 64:256)")
    w.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    w.add_argument("--seed", type=int, default=0, help="seed of lengths, token ids, sampling")
    w.add_argument(
        "--request-rate", type=float, default=None, help="online mode: Poisson arrivals, req/s"
    )
    w.add_argument("--prefix-len", type=int, default=None, help="shared prefix (default 256)")

    r = parser.add_argument_group("what runs")
    r.add_argument(
        "--model",
        default=None,
        help="comma list of embedded | tiny | 100m | micro | PATH (default: embedded)",
    )
    r.add_argument(
        "--engines",
        default=None,
        help=f"comma list of {','.join(ALL_ENGINES)} (default: {','.join(DEFAULT_ENGINES)})",
    )
    r.add_argument("--repeats", type=int, default=None, help="timed repeats, interleaved (3)")
    r.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads, all engines")
    r.add_argument("--hf-batch-sizes", default=None, help="static batch sizes to try (8,16,32,64)")
    r.add_argument("--vllm-python", default=None, help="python of vLLM's own virtualenv")
    r.add_argument("--no-extras", action="store_true", help="skip prefix-caching and floor runs")
    r.add_argument("--profile", action="store_true", help="cProfile nanovllm's step")
    r.add_argument("--serve", default=None, metavar="URL", help="also load a running server")
    r.add_argument("--quick", action="store_true", help="a seconds-long smoke run")

    e = parser.add_argument_group("engine sizes (nanovllm; mirrored in the peers)")
    e.add_argument("--max-num-seqs", type=int, default=64)
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--num-kv-blocks", type=int, default=None)
    e.add_argument("--max-model-len", type=int, default=None)

    o = parser.add_argument_group("output")
    o.add_argument("--plot", default=None, metavar="PNG", help="write the figure here")
    o.add_argument("--json", default=None, metavar="FILE", help="write JSON ('-': stdout)")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def config_from_args(args: argparse.Namespace):
    from nanovllm.bench.suite import ALL_ENGINES, BenchConfig

    cfg = BenchConfig(**(QUICK if args.quick else {}))
    if args.model:
        cfg.models = [m.strip() for m in args.model.split(",") if m.strip()]
    if args.engines:
        cfg.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        bad = [e for e in cfg.engines if e not in ALL_ENGINES]
        if bad:
            raise ValueError(f"unknown engine(s) {bad}; choose from {', '.join(ALL_ENGINES)}")
    if args.num_requests is not None:
        if args.num_requests < 1:
            raise ValueError(f"--num-requests must be >= 1, got {args.num_requests}")
        cfg.num_requests = args.num_requests
    if args.prompt_len:
        cfg.prompt_len = parse_range(args.prompt_len)
    if args.output_len:
        cfg.output_len = parse_range(args.output_len)
    if args.repeats is not None:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        cfg.repeats = args.repeats
    if args.hf_batch_sizes:
        cfg.hf_batch_sizes = _ints(args.hf_batch_sizes)
    if args.prefix_len is not None:
        cfg.prefix_len = args.prefix_len
    cfg.temperature = args.temperature
    cfg.seed = args.seed
    cfg.request_rate = args.request_rate
    cfg.threads = args.threads
    cfg.vllm_python = args.vllm_python
    cfg.extras = not args.no_extras
    cfg.profile = args.profile
    cfg.serve_url = args.serve
    cfg.max_num_seqs = args.max_num_seqs
    cfg.max_num_batched_tokens = args.max_num_batched_tokens
    cfg.block_size = args.block_size
    cfg.num_kv_blocks = args.num_kv_blocks
    cfg.max_model_len = args.max_model_len
    return cfg


class RichProgress:
    """The suite's Progress on a rich console: one bar per timed run, log lines above."""

    def __init__(self, console) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.bars = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tokens"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = None

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bars.__exit__(*exc)

    def start(self, description: str, total: int) -> None:
        self.task = self.bars.add_task(description, total=total)

    def advance(self, n: int) -> None:
        if self.task is not None:
            self.bars.advance(self.task, n)

    def done(self) -> None:
        if self.task is not None:
            self.bars.remove_task(self.task)
            self.task = None

    def log(self, message: str) -> None:
        self.console.log(message)


def run(args: argparse.Namespace) -> int:
    import logging
    import warnings

    from rich.console import Console

    from nanovllm.bench import report, suite

    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # transformers and vLLM chatter (generation flags, deprecations) would bury the bars.
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    to_stdout = args.json == "-"
    console = Console(stderr=to_stdout)
    if not console.is_terminal:
        console.width = max(console.width, 132)  # a log file: wide tables rather than wrapped
    try:
        with RichProgress(Console(stderr=True)) as progress:
            result = suite.run(cfg, progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report.print_report(result, console)
    if args.json:
        report.write_json(result, args.json)
    if args.plot:
        from nanovllm.bench.plot import plot

        plot(result, args.plot)
        console.print(f"plot written to {args.plot}")
    return 0
