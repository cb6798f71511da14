"""`nanovllm serve`: start the OpenAI-compatible server on a model.

    nanovllm serve                                  # the embedded model on 127.0.0.1:8000
    nanovllm serve --model ./ckpt --host 0.0.0.0 --port 8080 --max-num-seqs 32

It takes the same engine options as `nanovllm generate` (see `add_engine_arguments`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: folder)"
    )
    g.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="a Jinja chat template file, for a tokenizer that has none (or to replace its own)",
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from nanovllm.engine.generate_cli import add_engine_arguments

    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from nanovllm.config import EngineConfig
    from nanovllm.engine.generate_cli import engine_options
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
        engine = LLMEngine(EngineConfig(**engine_options(args)))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async_engine = AsyncLLMEngine(engine)
    try:
        app = build_app(
            async_engine, served_model_name=args.served_model_name, chat_template=chat_template
        )
        print(
            f"nanovllm: serving {app.state.serving.model_name!r} on "
            f"http://{args.host}:{args.port}/v1  (docs: /docs, events: /v1/events)",
            file=sys.stderr,
        )
        serve(app, args.host, args.port, log_level=args.log_level)
    finally:
        async_engine.shutdown()
    return 0
