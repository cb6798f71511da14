"""`nanovllm viz --web` in a real browser: headless Chromium (Debian's `chromium`, which `.ci/run`
installs) driven by playwright's Python API through `executable_path` (never `playwright
install`: nothing is downloaded).

The oracles: the kernel's table of listening sockets (`listeners.py`) for where it binds; the
HTTP status of requests without the key; every request the page makes, recorded by the
browser itself, for "nothing leaves loopback"; the terminal stream the app sends over the
websocket, for what it drew; the page's pixels, for what the browser showed.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from listeners import listening

from nanovllm.viz.web import app_argv

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium (.ci/run) and sets this, so there the test cannot skip.
REQUIRED = os.environ.get("NANOVLLM_REQUIRE_BROWSER") == "1"


def test_app_argv_drops_only_the_serving_options():
    argv = ["--web", "--scenario", "burst", "--host", "::1", "--port=0", "--paused", "--port", "9"]
    assert app_argv(argv) == ["--scenario", "burst", "--paused"]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def start_server(trace: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "nanovllm", "viz", "--web", "--replay", str(trace)]
    cmd += ["--paused", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, "nanovllm viz --web exited"
            continue
        if "http://" in line:
            return proc, line[line.index("http://") :].split()[0]
    proc.kill()
    raise AssertionError("nanovllm viz --web printed no URL in 60 s")


def browser():
    if CHROMIUM is None and not REQUIRED:
        pytest.skip("no chromium (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if REQUIRED:
            raise
        pytest.skip("no playwright (pip install -e '.[dev]')")
    assert CHROMIUM is not None, "CI needs chromium: apt-get install -y chromium"
    return sync_playwright


@pytest.mark.slow  # about 12 s: a server, an app process, a browser
def test_viz_in_a_browser(trace_path: Path):
    sync_playwright = browser()
    start = time.monotonic()
    proc, url = start_server(trace_path)
    try:
        # It listens only where told (loopback by default), on the port it printed.
        port = urlsplit(url).port
        assert listening(proc.pid) == [("127.0.0.1", port)]
        # Only the key lets in: every path without it is refused, the page's own files too.
        key = urlsplit(url).path.strip("/")
        root = f"http://127.0.0.1:{port}"
        assert status(url) == 200
        for path in ("/", "/ws", "/static/js/textual.js", f"/{key[:-1]}/", f"/x{key}/"):
            assert status(root + path) == 403, path
        assert status(f"{url}static/js/textual.js") == 200

        requested: list[str] = []
        frames: list[bytes] = []
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = chromium.new_page(viewport={"width": 1280, "height": 800})
            page.on("request", lambda r: requested.append(r.url))

            def on_websocket(ws) -> None:
                requested.append(ws.url)
                ws.on(
                    "framereceived",
                    lambda p: frames.append(p if isinstance(p, bytes) else p.encode()),
                )

            page.on("websocket", on_websocket)
            page.goto(url)

            def drawn(text: bytes, timeout: float = 60) -> None:
                deadline = time.monotonic() + timeout
                while text not in b"".join(frames):
                    assert time.monotonic() < deadline, f"the app never drew {text!r}"
                    page.wait_for_timeout(200)

            drawn(b"Queues")  # the app runs in its own process and drew its first screen
            # Keys go to the terminal once it has the focus (a person clicks it first).
            page.focus("textarea.xterm-helper-textarea")
            page.wait_for_timeout(1500)  # (the page fades the terminal in)
            before = page.screenshot()
            page.wait_for_timeout(500)
            assert page.screenshot() == before  # paused: the screen holds still
            seen = len(frames)
            page.keyboard.press("?")  # the help screen
            drawn(b"The engine runs")
            assert len(frames) > seen
            page.wait_for_timeout(1000)
            assert page.screenshot() != before  # the browser shows the change
            chromium.close()
        # Nothing left loopback: the page, its scripts, style, font and image, the websocket.
        hosts = {urlsplit(u).hostname for u in requested}
        assert hosts == {"127.0.0.1"}, requested
        assert any(u.endswith(".ttf") for u in requested)  # the font, served here
        print(f"browser test: {time.monotonic() - start:.1f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bad_web_options_are_named(trace_path: Path, capsys):
    from nanovllm.cli import main

    viz = ["viz", "--web", "--replay", str(trace_path)]
    assert main([*viz, "--port", "70000"]) == 2
    assert "--port must be 0-65535, got 70000" in capsys.readouterr().err
    assert main([*viz, "--record", "x.jsonl"]) == 2
    assert "--web does not go with --record" in capsys.readouterr().err
