"""`nanovllm serve`: start the OpenAI-compatible server on a model, with `vllm serve`'s flags.

    nanovllm serve                                  # the embedded model on 127.0.0.1:8000
    nanovllm serve ./ckpt --port 8080 --max-num-seqs 32 --api-key sk-local
    nanovllm serve --model ./ckpt --host 0.0.0.0    # --model works too
    nanovllm serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'
    nanovllm serve --disagg-proxy --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200

It takes the same engine options as `nanovllm generate` (see `add_engine_arguments`), plus
vLLM's spellings (`--enable-prefix-caching` / `--no-enable-prefix-caching`, the same for
chunked prefill, `--gpu-memory-utilization`, `--speculative-config`) and the server's own: where to listen, the API
key and the limits the guard enforces (guard.py). Every flag is listed in serve/README.md.
Nothing heavy is imported until `run`, so `nanovllm serve --help` loads no torch; with
`--disagg-proxy` (disagg_proxy.py) `run` loads no model and imports no torch either.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path

from nanovllm.serve.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
)

API_KEY_ENV = "NANOVLLM_API_KEY"
KEEP_ALIVE_ENV = "NANOVLLM_KEEP_ALIVE_ON_ENGINE_DEATH"
# = server.py's defaults (not imported: `nanovllm serve --help` loads no web stack)
DEFAULT_SHUTDOWN_TIMEOUT_S = 20.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="checkpoint folder or GGUF file, as `vllm serve MODEL` (same as --model; default: the embedded model)",
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all interfaces)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model's name(s) in the API, as vLLM's: requests may name any, responses name "
        "the first (default: MODEL as given; the embedded model's folder name without one)",
    )
    g.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="a Jinja chat template file, for a tokenizer that has none (or to replace its own)",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's: let the model decide to call tools (tool_choice 'auto'); needs "
        "--tool-call-parser",
    )
    g.add_argument(
        "--tool-call-parser",
        choices=["hermes"],
        default=None,
        help="vLLM's: how tool calls are read from the output ('hermes': <tool_call> tags)",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}, else none)",
    )
    g.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="larger request bodies get a 413 (default: %(default)s = 2 MiB)",
    )
    g.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=DEFAULT_MAX_CONCURRENT_REQUESTS,
        help="generation requests in flight at once; one more gets a 429 (0: no limit; "
        "default: %(default)s)",
    )
    g.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        help="text prompts longer than this are a 400 before they are tokenized (default: "
        "max_model_len x twice the longest token's text, a length that cannot fit)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a request's headers may take to arrive; a slower client gets a 408 and "
        "its connection is closed (default: %(default)s)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="seconds a request's whole body may take to arrive, else a 408 and the connection "
        "is closed (default: %(default)s)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM, seconds the running requests get to finish while /health answers "
        "503 and new requests are refused; then the rest are cut with an error chunk and the "
        "process exits 0 (default: %(default)s)",
    )
    g.add_argument(
        "--keep-alive-on-engine-death",
        action="store_true",
        default=None,
        help="when the engine dies (a tensor-parallel rank died), keep serving 503s instead of "
        f"exiting with status 1 for a supervisor to restart (default: ${KEEP_ALIVE_ENV}=1, "
        "else exit)",
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    d = parser.add_argument_group(
        "disaggregated prefill and decode (no model: see disagg_proxy.py)"
    )
    d.add_argument(
        "--disagg-proxy",
        action="store_true",
        help="run the proxy in front of a prefill and a decode server instead of a model",
    )
    d.add_argument("--prefill", metavar="URL", help="with --disagg-proxy: the prefill server")
    d.add_argument("--decode", metavar="URL", help="with --disagg-proxy: the decode server")
    d.add_argument(
        "--prefill-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --disagg-proxy: the longest wait for a prefill answer; past it, decode "
        "computes the prompt itself (default: %(default)s)",
    )
    d.add_argument(
        "--health-check-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="with --disagg-proxy: how often the prefill server's /health is polled (each poll "
        "bounded by it); while it fails, requests skip prefill (default: %(default)s)",
    )
    from nanovllm.engine.generate_cli import add_engine_arguments

    add_engine_arguments(parser)
    v = parser.add_argument_group("vLLM's spellings of engine options")
    v.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefix caching on (default) or off (--no-enable-prefix-caching = --no-prefix-caching)",
    )
    v.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="chunked prefill on (default) or off",
    )
    v.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="the fraction of GPU memory the engine may use, in (0, 1] (default: %(default)s)",
    )


def served_model_names(args: argparse.Namespace) -> list[str] | None:
    """The names the model is served as: `--served-model-name`, else MODEL as given (as
    `vllm serve /path/to/ckpt` serves `/path/to/ckpt`), else None (the embedded model)."""
    if args.served_model_name:
        return list(args.served_model_name)
    model = args.model_tag or args.model
    return [model] if model else None


def engine_config_options(args: argparse.Namespace) -> dict:
    """EngineConfig's arguments from the flags. ValueError when two flags disagree."""
    from nanovllm.engine.generate_cli import engine_options

    options = engine_options(args)
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(
                f"two models given: {args.model_tag!r} (positional) and --model {args.model!r}"
            )
        options["model"] = args.model_tag
    for name, ours in (
        ("enable_prefix_caching", "--no-prefix-caching"),
        ("enable_chunked_prefill", "--no-chunked-prefill"),
    ):
        value = getattr(args, name)
        if value is None:
            continue
        if value and not options[name]:
            raise ValueError(f"--{name.replace('_', '-')} contradicts {ours}")
        options[name] = value
    options["gpu_memory_utilization"] = args.gpu_memory_utilization
    return options


def server_options(args: argparse.Namespace) -> dict:
    """`build_app`'s guard arguments from the flags (and $NANOVLLM_API_KEY)."""
    if args.max_request_body_bytes < 1:
        raise ValueError(
            f"--max-request-body-bytes must be >= 1, got {args.max_request_body_bytes}"
        )
    if args.max_concurrent_requests < 0:
        raise ValueError(
            f"--max-concurrent-requests must be >= 0 (0: no limit), got "
            f"{args.max_concurrent_requests}"
        )
    if args.body_timeout <= 0:
        raise ValueError(f"--body-timeout must be > 0, got {args.body_timeout:g}")
    return dict(
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_request_body_bytes=args.max_request_body_bytes,
        max_concurrent_requests=args.max_concurrent_requests or None,
        body_timeout=args.body_timeout,
    )


def serve_options(args: argparse.Namespace, proxy: bool = False) -> dict:
    """`server.serve`'s arguments from the flags (and $NANOVLLM_KEEP_ALIVE_ON_ENGINE_DEATH)."""
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout:g}")
    if args.header_timeout <= 0:
        raise ValueError(f"--header-timeout must be > 0, got {args.header_timeout:g}")
    options: dict = dict(shutdown_timeout=args.shutdown_timeout, header_timeout=args.header_timeout)
    if not proxy:
        keep = args.keep_alive_on_engine_death
        if keep is None:
            keep = os.environ.get(KEEP_ALIVE_ENV, "0").strip().lower() in ("1", "true", "yes")
        options["keep_alive_on_engine_death"] = keep
    return options


# The flags a proxy takes; any other flag it is given (an engine's) would do nothing.
PROXY_FLAGS = frozenset(
    {"disagg_proxy", "prefill", "decode", "host", "port", "api_key", "log_level"}
    | {"max_request_body_bytes", "max_concurrent_requests", "shutdown_timeout"}
    | {"header_timeout", "body_timeout", "prefill_timeout", "health_check_interval"}
)


def proxy_options(args: argparse.Namespace) -> dict:
    """`build_proxy_app`'s arguments from the flags. ValueError when --prefill/--decode come
    without --disagg-proxy or it without them, or with a flag only a model server uses."""
    if not args.disagg_proxy:
        given = "--prefill" if args.prefill is not None else "--decode"
        raise ValueError(f"{given} is the proxy's flag: add --disagg-proxy (and give both)")
    missing = [f"--{n} URL" for n in ("prefill", "decode") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"--disagg-proxy needs {' and '.join(missing)}")
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    for action in defaults._actions:
        if action.dest in PROXY_FLAGS or action.dest == "help":
            continue
        if getattr(args, action.dest, action.default) != action.default:
            flag = action.option_strings[0] if action.option_strings else action.metavar
            raise ValueError(
                f"{flag} is a model server's flag: --disagg-proxy loads no model (give it to "
                "the prefill and decode servers)"
            )
    return dict(
        prefill_url=args.prefill,
        decode_url=args.decode,
        prefill_timeout_s=args.prefill_timeout,
        health_check_interval_s=args.health_check_interval,
        **server_options(args),
    )


def warn_if_open(host: str, api_key: str | None, what: str) -> None:
    """A warning when the server listens beyond loopback with no API key: anyone can `what`."""
    if api_key is None and host not in LOOPBACK:
        print(
            f"warning: listening on {host} without an API key: anyone who can reach this port "
            f"can {what} (--api-key or ${API_KEY_ENV})",
            file=sys.stderr,
        )


def warn_of_engine_ports(engine) -> None:
    """The engine's own listeners beside the HTTP port, where they reach beyond loopback: the
    KV link (on kv_ip, held by the KV secret) and torchrun's rendezvous (torchrun's own)."""
    from nanovllm.engine.tensor_parallel import under_torchrun
    from nanovllm.kv_transfer.secret import secret_source

    connector = engine.kv_source
    kv = getattr(connector, "config", None)
    if kv is not None and kv.kv_port is not None and kv.kv_ip not in LOOPBACK:
        source = secret_source(kv.kv_connector_extra_config.get("secret"))
        print(
            f"warning: the KV link listens on {kv.kv_ip}:{kv.kv_port}, beyond loopback: an engine "
            f"joins it only with the KV secret, from {source}; the KV itself crosses unencrypted",
            file=sys.stderr,
        )
    if engine.config.tensor_parallel_size > 1 and under_torchrun():
        print(
            "warning: torchrun's rendezvous and gloo listen where torchrun's flags and "
            "GLOO_SOCKET_IFNAME put them (not --host), open to whoever reaches them",
            file=sys.stderr,
        )


def run_proxy(args: argparse.Namespace) -> int:
    """`nanovllm serve --disagg-proxy`: no model, no torch; only the web stack and httpx."""
    from nanovllm.serve.disagg_proxy import build_proxy_app
    from nanovllm.serve.server import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    try:
        options = proxy_options(args)
        run_options = serve_options(args, proxy=True)
        app = build_proxy_app(**options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    warn_if_open(
        args.host,
        options["api_key"],
        "use both servers and watch every prompt on /prefill/v1/events",
    )
    print(
        f"nanovllm: disaggregated proxy on http://{args.host}:{args.port}/v1  (prefill: "
        f"{options['prefill_url']}, decode: {options['decode_url']})",
        file=sys.stderr,
    )
    return serve(app, args.host, args.port, log_level=args.log_level, **run_options)


def run(args: argparse.Namespace) -> int:
    if args.disagg_proxy or args.prefill is not None or args.decode is not None:
        return run_proxy(args)
    from nanovllm.config import EngineConfig
    from nanovllm.engine.llm_engine import LLMEngine
    from nanovllm.serve.api_server import build_app
    from nanovllm.serve.async_engine import AsyncLLMEngine
    from nanovllm.serve.server import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    chat_template = None
    if args.chat_template is not None:
        try:
            chat_template = args.chat_template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(
                f"error: cannot read chat template {str(args.chat_template)!r}: {exc}",
                file=sys.stderr,
            )
            return 2
    try:
        guard = server_options(args)
        run_options = serve_options(args)
        if args.max_prompt_chars is not None and args.max_prompt_chars < 1:
            raise ValueError(f"--max-prompt-chars must be >= 1, got {args.max_prompt_chars}")
        if args.enable_auto_tool_choice and args.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes)")
        engine = LLMEngine(EngineConfig(**engine_config_options(args)))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    warn_if_open(args.host, guard["api_key"], "use the model and watch every prompt on /v1/events")
    warn_of_engine_ports(engine)
    async_engine = AsyncLLMEngine(engine)
    try:
        app = build_app(
            async_engine,
            served_model_name=served_model_names(args),
            model_root=args.model_tag or args.model,
            chat_template=chat_template,
            max_prompt_chars=args.max_prompt_chars,
            tool_call_parser=args.tool_call_parser,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            **guard,
        )
        print(
            f"nanovllm: serving {app.state.serving.model_name!r} on "
            f"http://{args.host}:{args.port}/v1  (docs: /docs, events: /v1/events"
            f"{', API key required' if guard['api_key'] else ''})",
            file=sys.stderr,
        )
        # Start-up left hundreds of thousands of long-lived objects (the model, the tokenizer,
        # the app). Freeze them out of the collector's reach, as vLLM does: a full collection
        # while serving walked them all, and no stream got a token meanwhile (bench README).
        gc.collect()
        gc.freeze()
        code = serve(app, args.host, args.port, log_level=args.log_level, **run_options)
    finally:
        async_engine.shutdown()
    if code != 0:
        print(f"nanovllm: the engine died; exiting with status {code}", file=sys.stderr)
    return code
