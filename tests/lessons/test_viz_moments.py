"""`nanovllm lesson N --viz`: the visualizer opens on the request its moment was found on, and
gives the shell back as soon as it closes."""

from __future__ import annotations

import re

import pytest

from nanovllm.lessons.moments import MOMENTS


def _step(number: int, tables: dict[str, tuple[int, ...]]) -> list:
    """One step of decodes (one token each) whose block tables are `tables`."""
    from nanovllm.events import StepInputsPrepared, StepSummary

    ids = tuple(tables)
    n = len(ids)
    inputs = StepInputsPrepared(
        number,
        16,
        ids,
        (0,) * n,
        (0,) * n,
        (0,) * n,
        tuple(range(n + 1)),
        (33,) * n,
        tuple(tables.values()),
        tuple(range(n)),
        n,
    )
    summary = StepSummary(number, dict.fromkeys(ids, 1), 0, n, n, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
    return [inputs, summary]


def test_scattered_reads_name_the_request_whose_blocks_are_scattered():
    """Lesson 04's moment: request A reads blocks 0, 1, 2 (neighbours), B reads 2, 3, 5 (a
    jump): the moment is found on B, and B is the request the visualizer selects."""
    moment = MOMENTS["scattered_reads"]
    events = [*_step(1, {"a": (0, 1)}), *_step(2, {"a": (0, 1, 2), "b": (3, 4, 6)})]
    assert moment.find(events) == 2
    assert moment.request(events, 2) == "b"
    assert moment.request(events, 1) is None


def test_the_moments_of_one_event_name_its_request():
    from nanovllm.events import CacheHit, RequestPreempted, StepSummary

    summary = StepSummary(1, {"x": 1}, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
    hit = CacheHit("y", 4, 0, was_free=True, ref_count=1)
    assert MOMENTS["first_hit"].request([hit, summary], 1) == "y"
    preempted = RequestPreempted(1, "z", 0)
    assert MOMENTS["preemption"].request([preempted, summary], 1) == "z"


def test_the_visualizer_ends_the_process_on_a_terminal(monkeypatch, tmp_path):
    """Run from a lesson on a terminal, the visualizer's close ends the process at once (the
    interpreter's teardown of torch and the engines took 3 s before the shell's prompt); a
    screenshot returns, as a caller that goes on needs."""
    from nanovllm.lessons import viz_adapter
    from nanovllm.viz import cli

    seen = []
    monkeypatch.setattr(cli, "run", lambda args: seen.append(args) or 0)

    class Exited(Exception):
        pass

    def exit_now(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(viz_adapter.os, "_exit", exit_now)
    trace = tmp_path / "run.jsonl"
    with pytest.raises(Exited) as exited:
        viz_adapter.show(trace, 3, panel="executor", select="r1")
    assert exited.value.args == (0,)
    assert seen[-1].select == "r1" and seen[-1].steps == 3 and seen[-1].panel == "executor"
    assert viz_adapter.show(trace, 3, tmp_path / "shot.txt") == 0


@pytest.mark.slow
def test_lesson_04_viz_selects_the_request_whose_reads_are_scattered(home, tmp_path, capsys):
    """The screen shows attention reading the selected request's scattered blocks, the one the
    moment was found on (not request A, whose blocks are neighbours)."""
    pytest.importorskip("textual")
    from nanovllm.lessons.cli import main

    shot = tmp_path / "moment.txt"
    assert main(["4", "--viz", "--screenshot", str(shot)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    request = out.split(" selected)")[0].rsplit("(", 1)[1]
    line = next(line for line in shot.read_text().splitlines() if " reads ctx " in line)
    assert f" {request} reads ctx " in line, line
    reads = line.split(" reads ctx ")[1].split("│")[0]  # "33: L0→#2[16] ⇢ L1→#3[16] ⇢ ..."
    blocks = [int(block) for block in re.findall(r"#(\d+)\[", reads)]
    assert len(blocks) >= 3, line
    assert any(b != a + 1 for a, b in zip(blocks, blocks[1:])), line
