"""`nanovllm viz` from the command line: headless screenshots, record and replay, measurement,
and clear errors instead of tracebacks."""

from __future__ import annotations

from pathlib import Path

from nanovllm.cli import main


def test_screenshot_from_a_replay(trace_path: Path, tmp_path: Path, capsys):
    out = tmp_path / "shot.svg"
    code = main(
        ["viz", "--replay", str(trace_path), "--screenshot", str(out), "--steps", "5",
         "--size", "100x30"]
    )  # fmt: skip
    assert code == 0
    assert out.read_text().startswith("<svg")
    assert f"wrote {out} (step 5)" in capsys.readouterr().out


def test_record_then_replay_draws_the_same_screen(tiny_llama: Path, tmp_path: Path):
    trace, live, replay = tmp_path / "t.jsonl", tmp_path / "live.txt", tmp_path / "replay.txt"
    common = ["--steps", "4", "--size", "120x36"]
    engine = ["--model", str(tiny_llama), "--scenario", "prefix"]
    assert main(["viz", *engine, "--record", str(trace), "--screenshot", str(live), *common]) == 0
    assert main(["viz", "--replay", str(trace), "--screenshot", str(replay), *common]) == 0
    live_lines, replay_lines = live.read_text().splitlines(), replay.read_text().splitlines()
    assert "step 4" in live_lines[0] and "step 4" in replay_lines[0]
    # Between the status line (live: scenario and model; replay: the trace) and the footer
    # (a replay offers no `a` and no scenarios) the screens match.
    assert live_lines[1:-1] == replay_lines[1:-1]


def test_measure_prints_rates(trace_path: Path, capsys):
    assert main(["viz", "--replay", str(trace_path), "--measure", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "frames/s" in out and "steps/s" in out


def test_engine_error_is_reported_not_raised(tiny_llama: Path, tmp_path: Path, capsys):
    out = tmp_path / "err.txt"
    args = ["viz", "--model", str(tiny_llama), "--scenario", "chunked", "--no-chunked-prefill"]
    assert main([*args, "--screenshot", str(out)]) == 1
    assert "max_num_batched_tokens" in capsys.readouterr().err
    assert "error" in out.read_text()


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys):
    cases = [
        (["--replay", str(tmp_path / "none.jsonl"), "--screenshot", "x.svg"], "no trace"),
        (["--model", str(tmp_path), "--screenshot", "x.svg"], "no checkpoint"),
        (["--size", "big", "--measure", "1"], "--size"),
        (["--steps", "0", "--screenshot", "x.svg"], "--steps"),
        (["--screenshot", "x.svg", "--measure", "1"], "do not go together"),
        (["--kv-transfer-config", "{x", "--screenshot", "x.svg"], "--kv-transfer-config is not"),
        ([], "interactive terminal"),  # pytest's stdout is not a terminal
    ]
    for args, message in cases:
        assert main(["viz", *args]) == 2, args
        assert message in capsys.readouterr().err, args


def test_a_kv_connector_from_the_command_line_shows_its_tier(tiny_llama: Path, tmp_path: Path):
    """`--kv-transfer-config JSON` reaches the engine, the screen gains the tier's panel, and
    a recorded run with saves to the tier replays to the same screen."""
    import json

    trace, live, replay = tmp_path / "t.jsonl", tmp_path / "live.txt", tmp_path / "replay.txt"
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"num_cpu_blocks": 24},
    }
    common = ["--steps", "12", "--size", "160x48"]
    engine = ["--model", str(tiny_llama), "--scenario", "steady", "--num-kv-blocks", "16"]
    engine += ["--kv-transfer-config", json.dumps(config)]
    assert main(["viz", *engine, "--record", str(trace), "--screenshot", str(live), *common]) == 0
    assert main(["viz", "--replay", str(trace), "--screenshot", str(replay), *common]) == 0
    assert "kv_block_saved" in trace.read_text()  # the pool evicted, the tier saved
    live_lines, replay_lines = live.read_text().splitlines(), replay.read_text().splitlines()
    assert "OffloadingConnector" in live.read_text() and "step 12: " in live.read_text()
    assert live_lines[1:-1] == replay_lines[1:-1]


def test_the_hybrid_scenario_runs_records_and_replays(tmp_path: Path):
    """`--scenario hybrid` starts the embedded model with sliding-window layers, draws each
    request's two block tables (the sliding one's passed blocks as ∅) and exits; its trace
    (the KV cache groups in `EngineStarted`) replays to the same screen."""
    trace, live, replay = tmp_path / "t.jsonl", tmp_path / "live.txt", tmp_path / "replay.txt"
    common = ["--steps", "8", "--size", "160x48"]
    engine = ["--scenario", "hybrid"]
    assert main(["viz", *engine, "--record", str(trace), "--screenshot", str(live), *common]) == 0
    assert main(["viz", "--replay", str(trace), "--screenshot", str(replay), *common]) == 0
    text = live.read_text()
    assert "full [" in text and "win32 [∅" in text, text
    live_lines, replay_lines = live.read_text().splitlines(), replay.read_text().splitlines()
    assert live_lines[1:-1] == replay_lines[1:-1]
