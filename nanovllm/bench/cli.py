"""`nanovllm bench`: the command line over `suite.run`, with rich progress bars.

Every flag fills the `BenchConfig` field of the same name (`--num-requests` -> `num_requests`);
`--quick` starts from a seconds-long configuration instead of the defaults. Progress goes to
stderr, tables to stdout (to stderr with `--json -`, which prints the JSON alone on stdout).
Two flags start a measurement of their own instead, which reads the flags it uses:
`--structured-outputs` (structured.py), `--multi-turn` (kv_offload.py) and `--disagg`
(disagg.py).
"""

from __future__ import annotations

import argparse
import sys

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


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _engines(text: str) -> list[str]:
    from nanovllm.bench.engines import ENGINES

    if bad := [e for e in _names(text) if e not in ENGINES]:
        raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(ENGINES)}")
    return _names(text)


def _range(text: str) -> tuple[int, int]:
    from nanovllm.bench.workload import parse_range

    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_config(text: str, check) -> dict:
    """A JSON object, checked by `check` (which raises a ValueError naming the bad value)."""
    import json

    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    try:
        check(config)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return config


def _speculative_config(text: str) -> dict:
    """vLLM's `--speculative-config`: a JSON object, checked as the engine checks it."""
    from nanovllm.speculative_config import SpeculativeConfig

    return _json_config(text, SpeculativeConfig.from_dict)


def _kv_transfer_config(text: str) -> dict:
    """vLLM's `--kv-transfer-config`: a JSON object, checked as the engine checks it."""
    from nanovllm.kv_transfer.factory import checked_config

    return _json_config(text, checked_config)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nanovllm.bench.engines import ENGINES

    add = parser.add_argument
    add("--model", dest="models", type=_names, help="embedded|micro|tiny|100m|smollm2|PATH[,...]")
    add("--engines", metavar="E[,E]", type=_engines, help=f"of {', '.join(ENGINES)}")
    add("--num-requests", type=_positive, help="requests (default 64)")
    add("--prompt-len", type=_range, help="LO:HI prompt tokens (default 32:256)")
    add("--output-len", type=_range, help="LO:HI output tokens (default 64:256)")
    add("--temperature", type=float, help="0 = greedy (default)")
    add("--seed", type=int, help="seed of lengths, token ids, arrivals, sampling (0)")
    add("--request-rate", type=float, help="online: Poisson arrivals, requests/s")
    add("--repeats", type=_positive, help="timed repeats, interleaved (default 3)")
    add("--threads", type=_positive, help="torch / OpenMP threads, every engine")
    sizes = lambda t: [_positive(x) for x in _names(t)]  # noqa: E731
    add("--hf-batch-sizes", type=sizes, help="static batch sizes to try (8,16,32,64)")
    add("--vllm-python", help="python of vLLM's own virtualenv (default $VLLM_PYTHON)")
    add("--prefix-len", type=_positive, help="prefix-caching workload's shared prefix (256)")
    add("--no-extras", dest="extras", action="store_false", default=None, help="no prefix runs")
    add("--profile", action="store_true", default=None, help="cProfile nanovllm's step")
    add("--serve", dest="serve_url", metavar="URL", help="also load a running server")
    add("--api-key", help="the --serve server's key (default $NANOVLLM_API_KEY)")
    add("--quick", action="store_true", help="a seconds-long smoke run on a micro model")
    mirrored = "nanovllm's, mirrored by the peers"
    add("--max-num-seqs", type=_positive, help=f"default 64; {mirrored}")
    add("--max-num-batched-tokens", type=_positive, help=f"default 2048; {mirrored}")
    add("--block-size", type=_positive, help=f"default 16; {mirrored}")
    add("--num-kv-blocks", type=_positive, help="default: nanovllm sizes its cache")
    add("--max-model-len", type=_positive, help="default: the model's")
    add(
        "--speculative-config",
        metavar="JSON",
        type=_speculative_config,
        help='nanovllm speculates, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
        'or with a draft model \'{"model": "embedded:1", "num_speculative_tokens": 2}\' (a '
        "--model name or folder; NAME:N is NAME's first N layers), and is compared with "
        "nanovllm-no-spec",
    )
    add(
        "--kv-transfer-config",
        metavar="JSON",
        type=_kv_transfer_config,
        help='nanovllm runs a KV connector, e.g. \'{"kv_connector": "OffloadingConnector", '
        '"kv_connector_extra_config": {"num_cpu_blocks": 512}}\', and is compared with '
        "nanovllm-no-kv-transfer (nanovllm/kv_transfer/)",
    )
    add(
        "--tensor-parallel-size",
        type=_positive,
        help="nanovllm runs over this many processes, and is compared with nanovllm-tp1",
    )
    add(
        "--structured-outputs",
        action="store_true",
        help="only measure what the grammar mask adds per step: the same requests unconstrained "
        "and with a JSON schema, interleaved (nanovllm/bench/structured.py)",
    )
    add(
        "--async-scheduling",
        action="store_true",
        help="only nanovllm without and with async scheduling, the same greedy requests "
        "interleaved (nanovllm/bench/async_scheduling.py; --num-requests default 16, "
        "--output-len 64, --prompt-len 32:128)",
    )
    add(
        "--timeline",
        action="store_true",
        help="--async-scheduling: also print when each step's CPU work and forward pass ran",
    )
    add(
        "--multi-turn",
        action="store_true",
        help="only nanovllm without and with --kv-transfer-config (an OffloadingConnector), "
        "on multi-turn chats: each "
        "turn resends the conversation so far (nanovllm/bench/kv_offload.py); --prompt-len is "
        "a user message's length (default 32:64), --output-len an answer's (32:64)",
    )
    add(
        "--disagg",
        action="store_true",
        help="only co-located against disaggregated prefill/decode (P2pConnector), each as "
        "`nanovllm serve` processes pinned to two cores: steady streaming decodes, then a burst "
        "of long prompts (nanovllm/bench/disagg.py); --num-requests is the burst's size "
        "(default 8), --prompt-len its prompts (512), --output-len its outputs (16), "
        "--concurrency the steady streams (4)",
    )
    add("--num-conversations", type=_positive, help="--multi-turn: conversations (default 8)")
    add("--num-turns", type=_positive, help="--multi-turn: turns per conversation (default 4)")
    add(
        "--concurrency",
        type=_positive,
        help="--multi-turn: turns in flight at once (default 2); --disagg: steady streams "
        "(default 4); with --multi-turn and without --num-kv-blocks the "
        "device pool holds this many conversations at their longest",
    )
    add("--plot", metavar="PNG", help="write the figure here")
    add("--json", metavar="FILE", help="write the JSON document ('-': stdout)")


class RichProgress:
    """The suite's Progress on a rich console: one bar per timed run, log lines above it."""

    def __init__(self, console) -> None:
        from rich import progress as p

        self.console, self.task = console, None
        columns = (p.BarColumn(), p.MofNCompleteColumn(), p.TextColumn("tokens"))
        self.bars = p.Progress(
            p.TextColumn("{task.description:<30}"),
            *columns,
            p.TimeElapsedColumn(),
            console=console,
            transient=True,
        )

    def start(self, description: str, total: int) -> None:
        self.task = self.bars.add_task(description, total=total)

    def advance(self, n: int) -> None:
        self.bars.advance(self.task, n)

    def done(self) -> None:
        self.bars.remove_task(self.task)

    def log(self, message: str) -> None:
        self.console.log(message)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    from nanovllm.bench import report, suite

    if args.structured_outputs:
        return _structured_outputs(args)
    if args.async_scheduling:
        return _async_scheduling(args)
    if args.multi_turn:
        return _multi_turn(args)
    if args.disagg:
        return _disagg(args)
    fields = {f.name for f in dataclasses.fields(suite.BenchConfig)}
    given = {k: v for k, v in vars(args).items() if v is not None and k in fields}
    cfg = suite.BenchConfig(**{**(QUICK if args.quick else {}), **given})
    # transformers' chatter (generation flags, deprecations) would bury the bars.
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    code, result, console = _measure_and_report(
        args, lambda progress: suite.run(cfg, progress), report.print_report
    )
    if code == 0 and args.plot:
        from nanovllm.bench.plot import plot

        plot(result, args.plot)
        console.print(f"plot written to {args.plot}")
    return code


def _measure_and_report(args: argparse.Namespace, measure, print_report) -> tuple:
    """`measure(progress)` under progress bars, then `print_report(result, console)` and the
    JSON (`--json`). A ValueError is an error line and exit code 2. Returns the exit code, the
    result (None on an error) and the console the report went to."""
    from rich.console import Console

    from nanovllm.bench import report

    console = Console(stderr=args.json == "-")
    if not console.is_terminal:
        console.width = max(console.width, 140)  # a log file: wide tables rather than wrapped
    progress = RichProgress(Console(stderr=True))
    try:
        with progress.bars:
            result = measure(progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, None, console
    print_report(result, console)
    if args.json:
        report.write_json(result, args.json)
    return 0, result, console


def _multi_turn(args: argparse.Namespace) -> int:
    """`--multi-turn`: nanovllm alone, without and with `--kv-transfer-config`."""
    import torch

    from nanovllm.bench import kv_offload
    from nanovllm.bench.engines import EngineLimits

    if args.kv_transfer_config is None:
        print(
            "error: --multi-turn compares nanovllm without and with a KV connector: give "
            '--kv-transfer-config, e.g. \'{"kv_connector": "OffloadingConnector", '
            '"kv_connector_extra_config": {"num_cpu_blocks": 512}}\'',
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    limits = EngineLimits(threads=args.threads, seed=args.seed or 0)
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks"):
        if getattr(args, name) is not None:
            setattr(limits, name, getattr(args, name))

    def measure(progress: RichProgress) -> dict:
        return kv_offload.run(
            args.kv_transfer_config,
            limits,
            model=(args.models or ["embedded"])[0],
            max_model_len=args.max_model_len,
            num_conversations=args.num_conversations or 8,
            num_turns=args.num_turns or 4,
            user_len=args.prompt_len or (32, 64),
            answer_len=args.output_len or (32, 64),
            concurrency=args.concurrency or 2,
            repeats=args.repeats or 3,
            seed=args.seed or 0,
            progress=progress,
        )

    return _measure_and_report(args, measure, kv_offload.print_report)[0]


def _disagg(args: argparse.Namespace) -> int:
    """`--disagg`: co-located and disaggregated servers, side by side."""
    from nanovllm.bench import disagg

    def measure(progress: RichProgress) -> dict:
        return disagg.run(
            model=(args.models or ["embedded"])[0],
            num_steady=args.concurrency or 4,
            num_burst=args.num_requests or 8,
            burst_prompt_len=args.prompt_len or (512, 512),
            burst_output_len=args.output_len[1] if args.output_len else 16,
            repeats=args.repeats or 3,
            seed=args.seed or 0,
            block_size=args.block_size or 16,
            max_num_batched_tokens=args.max_num_batched_tokens or 2048,
            max_model_len=args.max_model_len,
            progress=progress,
        )

    return _measure_and_report(args, measure, disagg.print_report)[0]


def _alone(args: argparse.Namespace) -> dict:
    """For a nanovllm-alone comparison: set the thread count; the engine options given."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    names = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _async_scheduling(args: argparse.Namespace) -> int:
    """`--async-scheduling`: nanovllm alone, the plain step loop vs the overlapped one."""
    import json

    from nanovllm.bench import async_scheduling

    options = _alone(args)
    result = async_scheduling.run(
        model=(args.models or ["embedded"])[0],
        num_requests=args.num_requests or 16,
        prompt_len=tuple(args.prompt_len) if args.prompt_len else (32, 128),
        output_len=args.output_len[1] if args.output_len else 64,
        repeats=args.repeats or 3,
        seed=args.seed or 0,
        timeline=args.timeline,
        **options,
    )
    async_scheduling.print_report(result)
    if args.json:
        text = json.dumps(result, indent=2)
        print(text) if args.json == "-" else open(args.json, "w").write(text)
    return 0


def _structured_outputs(args: argparse.Namespace) -> int:
    """`--structured-outputs`: nanovllm alone, unconstrained vs a JSON schema per request."""
    import json

    from nanovllm.bench import structured

    options = _alone(args)
    result = structured.run(
        model=(args.models or ["embedded"])[0],
        num_requests=args.num_requests or 16,
        output_len=args.output_len[1] if args.output_len else 64,
        repeats=args.repeats or 3,
        temperature=args.temperature or 0.0,
        seed=args.seed or 0,
        **options,
    )
    structured.print_report(result)
    if args.json:
        text = json.dumps(result, indent=2)
        print(text) if args.json == "-" else open(args.json, "w").write(text)
    return 0
