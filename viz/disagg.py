"""The `disagg` scenario: a prefill engine and a decode engine in one process, and their states.

Disaggregated serving (`nanovllm/kv_transfer/p2p.py`) splits a request over two engines joined
by the P2pConnector's link on a loopback port: the producer (kv_producer) runs the prompt with
`max_tokens=1` and sends its full KV blocks, the consumer (kv_consumer) loads them and decodes.
`DisaggRun` drives both on a scenario's workload, one tick at a time:

    arrivals       each new request goes to the prefill engine (do_remote_decode)
    prefill step   one step of the producer (its finished requests' transfers are done or
                   under way: the link's sender thread sends them)
    hand over      each request the producer finished goes to the decode engine
                   (do_remote_prefill) once its transfer's DONE arrived (or failed: then the
                   consumer computes the prompt itself and says why, `KVLoadFailed`)
    decode step    one step of the consumer

so new prompts prefill on one engine while earlier requests decode on the other. A request has
the same id on both engines, and that id names its transfer.

Every event is tagged with its engine here (`link.Tagged`); the engines know nothing of each
other. `DisaggState` holds each engine's `VizState`, reduced by the same `state.reduce` from its
own events, and the link's `LinkState` (`link.py`); `DisaggTape` records the tagged events, a
step of either engine being one step of the tape.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from typing import Any

from nanovllm.events import Event, RequestFinished, RequestRejected, StepSummary
from nanovllm.viz.history import Tape
from nanovllm.viz.link import DECODE, PREFILL, LinkState, Tagged, reduce_link
from nanovllm.viz.scenarios import Arrival, Workload
from nanovllm.viz.state import VizState, reduce

TRANSFER_TIMEOUT_S = 10.0  # a transfer not done by then fails: the consumer computes the prompt


@dataclass(frozen=True)
class DisaggState:
    """The two engines' states and the link between them."""

    prefill: VizState = field(default_factory=VizState)
    decode: VizState = field(default_factory=VizState)
    link: LinkState = field(default_factory=LinkState)

    @property
    def step(self) -> int:
        """The decode engine's last step: what the top line shows, and what `max_steps` and
        `--steps` count (the app draws the decode engine's state where it draws one)."""
        return self.decode.step


def reduce_disagg(state: DisaggState, tagged: Tagged) -> DisaggState:
    """The state after `tagged`: its engine's state reduced by `state.reduce`, and the link."""
    link = reduce_link(state.link, tagged)
    if tagged.engine == PREFILL:
        return replace(state, prefill=reduce(state.prefill, tagged.event), link=link)
    return replace(state, decode=reduce(state.decode, tagged.event), link=link)


class DisaggTape(Tape):
    """A tape of tagged events: each engine's `StepSummary` ends a step of the tape."""

    def __init__(self, state: Any = None, max_history: int = 300) -> None:
        super().__init__(state or DisaggState(), max_history)  # type: ignore[arg-type]

    @staticmethod
    def reduce(state, event):
        return reduce_disagg(state, event)

    @staticmethod
    def starts(event) -> bool:
        return False  # both engines start on one tape (a new run makes a new tape)

    @staticmethod
    def closes(event) -> bool:
        return isinstance(event.event, StepSummary)


def free_port() -> int:
    """A TCP port free on the loopback interface now (the consumer binds it at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DisaggRun:
    """The two engines and the requests between them. `options`: both engines' EngineConfig."""

    def __init__(self, options: dict[str, Any], workload: Workload) -> None:
        from nanovllm import EngineConfig, LLMEngine

        port = free_port()
        options = {k: v for k, v in options.items() if k != "kv_transfer_config"}

        def config(role: str) -> EngineConfig:
            link = {"kv_connector": "P2pConnector", "kv_role": role, "kv_port": port}
            link["kv_connector_extra_config"] = {"timeout_s": TRANSFER_TIMEOUT_S}
            return EngineConfig(**options, kv_transfer_config=link)

        self.pending: list[Tagged] = []
        self.decode = LLMEngine(config("kv_consumer"))  # first: it listens, the producer joins
        try:
            self.prefill = LLMEngine(config("kv_producer"))
        except BaseException:
            self.decode.shutdown()
            raise
        self.workload = workload
        self.tick = 0
        self.num_arrivals = 0
        self.plans: dict[str, Arrival] = {}  # added to the prefill engine, not yet handed over
        self.prefilled: list[str] = []  # finished on the prefill engine this tick
        self._unsubscribe = [
            self.prefill.subscribe(lambda e: self._on_event(PREFILL, e)),
            self.decode.subscribe(lambda e: self._on_event(DECODE, e)),
        ]

    def _on_event(self, engine: str, event: Event) -> None:
        self.pending.append(Tagged(engine, event))
        if engine == PREFILL and isinstance(event, RequestFinished | RequestRejected):
            if event.request_id in self.plans:
                if isinstance(event, RequestFinished):
                    self.prefilled.append(event.request_id)
                else:
                    del self.plans[event.request_id]

    def take_events(self) -> list[Tagged]:
        events, self.pending = self.pending, []
        return events

    @property
    def model_name(self) -> str:
        return self.prefill.model_path.name

    def add(self, request_id: str, arrival: Arrival) -> None:
        """Send a request to the prefill engine; it goes on to the decode engine later."""
        from nanovllm import SamplingParams

        params = SamplingParams(
            temperature=arrival.temperature,
            top_k=50,
            max_tokens=1,
            seed=arrival.seed,
            ignore_eos=True,
            extra_args={
                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": request_id}
            },
        )
        self.plans[request_id] = arrival
        try:
            self.prefill.add_request(request_id, arrival.prompt, params)
        except ValueError:
            del self.plans[request_id]  # a RequestRejected event tells the UI
            raise

    def hand_over(self, request_id: str) -> None:
        """The request's second half, on the decode engine, once its transfer is over."""
        from nanovllm import SamplingParams

        arrival = self.plans.pop(request_id)
        # Loopback: the DONE follows the blocks within milliseconds. A failure is not raised:
        # the consumer finds it (`transfer_error`), says why and computes the prompt.
        self.decode.kv_source.wait_for_transfer(request_id, TRANSFER_TIMEOUT_S)
        params = SamplingParams(
            temperature=arrival.temperature,
            top_k=50,
            max_tokens=arrival.max_tokens,
            seed=arrival.seed,
            ignore_eos=True,
            extra_args={
                "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": request_id}
            },
        )
        try:
            self.decode.add_request(request_id, arrival.prompt, params)
        except ValueError:
            pass  # a RequestRejected event tells the UI

    def pull(self, waiting: int) -> tuple[list[Tagged], int]:
        """One tick: arrivals, a prefill step, hand-overs, a decode step. Returns the tick's
        tagged events and the engine steps run. `waiting`: both engines' queues."""
        busy = self.prefill.has_unfinished_requests() or self.decode.has_unfinished_requests()
        waiting += len(self.plans)  # requests not yet decoding wait too
        for arrival in self.workload.arrivals(self.tick, busy, waiting):
            self.num_arrivals += 1
            try:
                self.add(f"r{self.num_arrivals}", arrival)
            except ValueError:
                pass
        self.tick += 1
        steps = 0
        if self.prefill.has_unfinished_requests():
            self.prefill.step()
            steps += 1
        prefilled, self.prefilled = self.prefilled, []
        for request_id in prefilled:
            self.hand_over(request_id)
        if self.decode.has_unfinished_requests():
            self.decode.step()
            steps += 1
        return self.take_events(), steps

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        for engine in (self.prefill, self.decode):
            engine.shutdown()  # (each link stops; its idle thread ends with the process)
