"""`nanovllm viz --web`: the same app in a browser, so a class can watch without a terminal.

textual-serve runs a Textual app as a child process per browser tab (Textual's web driver
speaks to it over the child's stdin and stdout) and relays its screen over a websocket to
xterm.js in the page. This module serves `nanovllm viz` with the options it was given, less
`--web`, `--host` and `--port`, and adds what a listener of this project must have:

- it binds only to the address it is given (`--host`, loopback by default);
- it lets in only who holds the key: a fresh random key is the first segment of every path
  (`http://127.0.0.1:8000/KEY/`), printed at start; any other path gets 403, static files
  and the websocket included;
- nothing is fetched from elsewhere: textual-serve's page asks Google for its font, so the
  page here is its template (`web_index.html`) with that line replaced by the same font
  (Roboto Mono, Apache-2.0) from textual-serve's own static files, which serve the scripts,
  the stylesheet and the image too (textual-serve: MIT; xterm.js inside it: MIT).
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import signal
import sys
from pathlib import Path

from aiohttp import web

# Options of the serving process that the app process (one per browser tab) must not get.
WEB_FLAGS = ("--web",)
WEB_OPTIONS = ("--host", "--port")
TEMPLATE = Path(__file__).with_name("web_index.html")
# Tells the app process that it runs under `--web`: it refuses to serve another level.
CHILD_ENV = "NANOVLLM_VIZ_WEB_CHILD"


def app_argv(argv: list[str]) -> list[str]:
    """`nanovllm viz`'s arguments less the serving ones (`--web`, `--host H`, `--port=P`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in WEB_FLAGS or arg.split("=", 1)[0] in WEB_OPTIONS and "=" in arg:
            continue
        elif arg in WEB_OPTIONS:
            skip = True  # and its value
        else:
            out.append(arg)
    return out


def url_host(host: str) -> str:
    """`host` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def _server_class():
    """`KeyedServer`, built on first use: textual-serve is an extra (`pip install -e .[web]`)."""
    import aiohttp_jinja2
    import jinja2
    from textual_serve.server import Server

    class KeyedServer(Server):
        """textual-serve's server with every route under `/KEY/`, the page from
        `web_index.html`, and a 403 for any path without the key."""

        def __init__(self, command: str, host: str, port: int, key: str) -> None:
            super().__init__(command, host=host, port=port, title="nanovllm viz")
            self.key = key

        @web.middleware
        async def check_key(self, request: web.Request, handler):
            first = request.path.lstrip("/").split("/", 1)[0]
            if not secrets.compare_digest(first.encode(), self.key.encode()):
                raise web.HTTPForbidden(
                    text="nanovllm viz --web: open the URL it printed (the key is in its path)\n"
                )
            return await handler(request)

        async def _make_app(self) -> web.Application:
            app = web.Application(middlewares=[self.check_key])
            aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(TEMPLATE.parent))
            prefix = f"/{self.key}"
            app.add_routes(
                [
                    web.get(f"{prefix}/", self.handle_index, name="index"),
                    web.get(f"{prefix}/ws", self.handle_websocket, name="websocket"),
                    web.static(f"{prefix}/static", self.statics_path, name="static"),
                ]
            )
            return app

        @aiohttp_jinja2.template(TEMPLATE.name)
        async def handle_index(self, request: web.Request):
            return await Server.handle_index.__wrapped__(self, request)

    return KeyedServer


async def _serve(server, host: str, port: int, ready) -> None:
    app = await server._make_app()
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(
            f"error: nanovllm viz --web cannot listen on {host}:{port}: {exc}"
        ) from None
    bound = runner.addresses[0][1]  # (port 0: the one the system chose)
    server.public_url = f"http://{url_host(host)}:{bound}"
    ready(f"{server.public_url}/{server.key}/")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # closes the websockets: each tab's app process is told to quit


def serve_web(argv: list[str], host: str, port: int) -> int:
    """Serve `nanovllm viz ARGV` (one app process per browser tab) at `host:port` until
    Ctrl+C; the URL with the key is printed first."""
    command = shlex.join([sys.executable, "-m", "nanovllm", "viz", *app_argv(argv)])
    key = secrets.token_urlsafe(24)
    server = _server_class()(f"{CHILD_ENV}=1 {command}", host, port, key)

    def ready(url: str) -> None:
        print(f"nanovllm viz in a browser: {url}", flush=True)
        print("(only this URL lets in: its path holds the key; Ctrl+C stops)", flush=True)

    asyncio.run(_serve(server, host, port, ready))
    return 0
