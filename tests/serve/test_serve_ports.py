"""Every listener binds the address it is given: servers started as the README starts them.

A default two-rank server, and a disaggregated pair with its proxy, each a real `nanovllm
serve` process (their worker processes too). The oracle is the kernel's table of listening
sockets (`tests/listeners.py`), read while they serve, after a request has crossed the KV link
(the link's connections open then). And the KV port, which must be reachable by the other
engine, tells a client without the KV secret nothing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent))  # for `listeners`
from listeners import beyond_loopback, listening  # noqa: E402

from nanovllm.serve.cli import warn_of_engine_ports  # noqa: E402

START_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nanovllm", "serve", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_healthy(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not start within {START_S} s")


def family(pid: int) -> list[int]:
    """`pid` and its descendants (a server's tensor-parallel workers)."""
    pids, i = [pid], 0
    while i < len(pids):
        children = Path(f"/proc/{pids[i]}/task/{pids[i]}/children")
        if children.exists():
            pids += [int(c) for c in children.read_text().split()]
        i += 1
    return pids


def open_beyond_loopback(processes: list[subprocess.Popen]) -> dict[int, list]:
    found = {}
    for process in processes:
        for pid in family(process.pid):
            try:
                if beyond := beyond_loopback(pid):
                    found[pid] = beyond
            except FileNotFoundError:
                pass  # exited meanwhile (a short-lived helper)
    return found


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_two_rank_server_and_a_disaggregated_pair_listen_on_loopback_alone(tiny_llama) -> None:
    model = str(tiny_llama)
    kv_port = free_port()
    ports = [free_port() for _ in range(4)]
    link = {"kv_connector": "P2pConnector", "kv_port": kv_port}
    producer = json.dumps({**link, "kv_role": "kv_producer"})
    consumer = json.dumps({**link, "kv_role": "kv_consumer"})
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    processes = [
        serve(model, "--port", str(ports[0]), "--tensor-parallel-size", "2"),
        serve(model, "--port", str(ports[1]), "--kv-transfer-config", producer),
        serve(model, "--port", str(ports[2]), "--kv-transfer-config", consumer),
        serve("--disagg-proxy", "--prefill", urls[1], "--decode", urls[2], "--port", str(ports[3])),
    ]
    try:
        for url, process in zip(urls, processes):
            wait_healthy(url, process)
        assert open_beyond_loopback(processes) == {}
        body = {"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13], "max_tokens": 3, "temperature": 0}
        for url in (urls[0], urls[3]):  # two ranks; the pair through its proxy
            assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
        assert open_beyond_loopback(processes) == {}
        assert ("127.0.0.1", kv_port) in listening(processes[2].pid)
        # The KV port answers anyone who reaches it with a challenge, and a client that cannot
        # answer it gets a refusal (zeros) and the door: no store, no key.
        with socket.create_connection(("127.0.0.1", kv_port), timeout=10) as stranger:
            challenge = stranger.recv(32)
            stranger.sendall(bytes(64))  # a wrong answer
            assert len(challenge) == 32 and stranger.recv(64) == bytes(32)
            assert stranger.recv(64) == b""
    finally:
        stop(processes)


def test_the_open_port_warning_names_the_kv_link_beyond_loopback(capsys, monkeypatch) -> None:
    monkeypatch.setenv("NANOVLLM_KV_SECRET", "s")
    kv = SimpleNamespace(kv_ip="10.1.2.3", kv_port=14579, kv_connector_extra_config={})
    engine = SimpleNamespace(
        kv_source=SimpleNamespace(config=kv),
        config=SimpleNamespace(tensor_parallel_size=1),
    )
    warn_of_engine_ports(engine)
    err = capsys.readouterr().err
    assert "10.1.2.3:14579" in err and "$NANOVLLM_KV_SECRET" in err
    kv.kv_ip = "127.0.0.1"
    warn_of_engine_ports(engine)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    engine.config.tensor_parallel_size = 2
    warn_of_engine_ports(engine)
    assert "torchrun" in capsys.readouterr().err
