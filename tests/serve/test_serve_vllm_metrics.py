"""/metrics against vLLM's own list of metric families (tests/vllm_reference/metric_families.json,
recorded from vLLM 0.32.0's stat logger by tests/vllm_reference/record_metric_names.py).

One server on a small KV cache gets a prompt twice (a prefix-cache hit) and then four prompts at
once that do not fit together (preemptions); a second, speculating, gets one request (so the
speculative decoding families are served too). Then:
- every `vllm:` family served is vLLM's: the same name, type, label names and buckets;
- every vLLM family is served, or named in the serve README's list of those nanovllm cannot fill;
- the counters equal an independent count: the engine's own events, the requests sent, and
  FLOPs counted from the model's own weights and the steps' scheduled tokens.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import wait_idle

from nanovllm import EngineConfig, LLMEngine
from nanovllm.events import Event
from nanovllm.serve.api_server import build_app
from nanovllm.serve.async_engine import AsyncLLMEngine
from nanovllm.serve.perf import ModelShape
from nanovllm.serve.server import ServerThread

ROOT = Path(__file__).resolve().parents[2]
VLLM = json.loads((ROOT / "tests/vllm_reference/metric_families.json").read_text())
README = ROOT / "nanovllm/serve/README.md"
NOT_SERVED_HEADING = "### vLLM's families nanovllm does not serve"
TOKEN_BUCKET_FAMILIES = {  # sized by max_model_len (1-2-5 up to it), as vLLM sizes them
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens",
}
SHARED = [(5 * j) % 200 + 3 for j in range(12)]  # three blocks of 4: the second send hits them
CONCURRENT = [[(11 * i + 3 * j) % 200 + 3 for j in range(8)] for i in range(4)]
MAX_TOKENS = 12


def not_served_in_readme() -> set[str]:
    """The `vllm:` names in the first column of the README's table of families not served."""
    text = README.read_text()
    assert NOT_SERVED_HEADING in text, f"{README} lacks {NOT_SERVED_HEADING!r}"
    section = text.split(NOT_SERVED_HEADING, 1)[1].split("\n#", 1)[0]
    return {m for line in section.splitlines() for m in re.findall(r"^\| `(vllm:\w+)`", line)}


def serve(
    config: EngineConfig,
    prompts: list[list[int]],
    concurrent: list[list[int]] = (),
    **app_options,
):
    """Serve `prompts` one by one, then `concurrent` at once (`app_options` to `build_app`);
    return (families by name, the events the engine emitted, the usages, the engine)."""
    llm_engine = LLMEngine(config)
    events: list[Event] = []
    llm_engine.subscribe(events.append)  # the oracle: the engine's own account
    engine = AsyncLLMEngine(llm_engine)
    try:
        with ServerThread(build_app(engine, **app_options)) as server:

            def send(prompt: list[int]) -> dict:
                body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                        "ignore_eos": True}  # fmt: skip
                response = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
                assert response.status_code == 200, response.text
                return response.json()["usage"]

            usages = [send(prompt) for prompt in prompts]
            if concurrent:
                with ThreadPoolExecutor(len(concurrent)) as pool:
                    usages += list(pool.map(send, concurrent))
            wait_idle(engine)
            text = httpx.get(server.url + "/metrics").text
    finally:
        engine.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in list(families):  # `x_created` (a counter's or histogram's start time, as
        if name.endswith("_created") and name[: -len("_created")] in families:  # in vLLM's
            del families[name]  # /metrics) parses as a family of its own: not one
    return families, events, usages, llm_engine


@pytest.fixture(scope="module")
def run(model_path):
    # 7 blocks of 4: a request of 8 + 12 tokens takes 5, so any two that overlap preempt.
    config = EngineConfig(model=str(model_path), block_size=4, num_kv_blocks=7)
    return serve(config, [SHARED, SHARED], CONCURRENT)


@pytest.fixture(scope="module")
def spec_run(model_path):
    """Speculating, and with a tool-call parser (its family is served only then, as vLLM's)."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    config = EngineConfig(model=str(model_path), speculative_config=spec)
    return serve(config, [[58] * 6], tool_call_parser="hermes", enable_auto_tool_choice=False)


def value(families, name: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of `name` (its `sample` suffix) with these labels beyond model and engine."""
    (found,) = [
        s.value
        for s in families[name].samples
        if s.name == name + (sample or "")
        and {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")} == labels
    ]
    return found


@pytest.mark.quick
def test_served_families_are_vllms_and_vllms_are_served_or_named(run, spec_run):
    families = {**run[0], **spec_run[0]}
    max_model_len = max(run[3].max_model_len, spec_run[3].max_model_len)
    ours = {name for name in families if name.startswith("vllm:")}
    assert ours, "no vllm: family served"
    for name in sorted(ours):
        assert name in VLLM["families"], f"{name} is not a vLLM family"
        want, family = VLLM["families"][name], families[name]
        assert family.type == want["type"], name
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        if name == "vllm:cache_config_info":  # a few of vLLM's CacheConfig fields
            assert labels <= set(want["labels"]), labels - set(want["labels"])
        else:
            assert labels == set(want["labels"]), name
        if family.type == "histogram":
            bounds = {s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}
            buckets = sorted(float(b) for b in bounds if b != "+Inf")
            expected = want["buckets"]
            if name in TOKEN_BUCKET_FAMILIES:
                assert max_model_len <= VLLM["max_model_len"]
                expected = [b for b in expected if b <= max_model_len]
            assert buckets == expected, name
    not_served = not_served_in_readme()
    assert not (not_served & ours), "served, yet listed as not served"
    missing = set(VLLM["families"]) - ours - not_served
    assert not missing, f"vLLM families neither served nor named in the README: {missing}"


def test_the_tool_parser_family_is_vllms_and_starts_at_zero(run, spec_run):
    """`--tool-call-parser` serves vLLM's counter (with or without auto tool choice), its HELP
    text vLLM's and its 12 label sets at 0 from the start; without a parser it is absent."""
    name = "vllm:tool_call_parser_invocations"
    assert name not in run[0]
    family = spec_run[0][name]
    assert family.documentation == VLLM["families"][name]["help"]
    totals = [s for s in family.samples if s.name == name + "_total"]
    combos = {(s.labels["mode"], s.labels["outcome"], s.labels["request_type"]) for s in totals}
    assert len(totals) == len(combos) == 12 and {s.value for s in totals} == {0}
    assert {m for m, _, _ in combos} == {"streaming", "non_streaming"}
    assert {o for _, o, _ in combos} == {"tool_call", "no_tool_call"}
    assert {r for _, _, r in combos} == {"chat_completions", "responses", "other"}


def test_counters_equal_the_engines_events(run):
    families, events, usages, _ = run
    preempted = [e for e in events if e.kind == "request_preempted"]
    first_scheduled: dict[str, int] = {}  # request -> prompt tokens cached at its admission
    for e in events:
        if e.kind == "request_scheduled":
            first_scheduled.setdefault(e.request_id, e.num_computed_tokens)
    finished = [e for e in events if e.kind == "request_finished"]
    assert len(finished) == len(usages) == 6
    assert preempted, "the requests were meant to be preempted"
    cached = sum(first_scheduled.values())
    assert cached > 0, "the repeated prompt was meant to hit the prefix cache"
    prompt = sum(u["prompt_tokens"] for u in usages)

    assert value(families, "vllm:num_preemptions", "_total") == len(preempted)
    assert value(families, "vllm:request_num_preemptions", "_sum") == len(preempted)
    assert value(families, "vllm:request_num_preemptions", "_count") == len(finished)
    assert value(families, "vllm:prompt_tokens", "_total") == prompt
    assert value(families, "vllm:generation_tokens", "_total") == sum(
        u["completion_tokens"] for u in usages
    )
    assert value(families, "vllm:prompt_tokens_cached", "_total") == cached
    by_source = {
        source: value(families, "vllm:prompt_tokens_by_source", "_total", source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert by_source == {
        "local_compute": prompt - cached,
        "local_cache_hit": cached,
        "external_kv_transfer": 0,
    }
    kv_computed = value(families, "vllm:request_prefill_kv_computed_tokens", "_sum")
    assert kv_computed == prompt - cached
    # Re-admissions after a preemption look the prefix cache up again: hits >= first hits.
    hits = value(families, "vllm:prefix_cache_hits", "_total")
    assert hits >= cached
    device = value(families, "vllm:prompt_tokens_cached_by_source", "_total", source="device")
    assert device == hits
    assert value(families, "vllm:external_prefix_cache_queries", "_total") == 0  # no connector
    assert value(families, "vllm:request_success", "_total", finished_reason="length") == 6
    assert value(families, "vllm:num_requests_waiting_by_reason", reason="capacity") == 0
    assert value(families, "vllm:engine_sleep_state", sleep_state="awake") == 1
    # Every request finished with 12 tokens, so each has a mean time per output token.
    assert value(families, "vllm:request_time_per_output_token_seconds", "_count") == 6


def test_estimated_flops_count_the_models_weights_and_the_steps_tokens(run):
    """vLLM's FLOPs model, recounted from the model's own weight matrices and the tokens each
    step scheduled (its RequestScheduled events): 2 per weight per token in every layer, 4 per
    query dimension per token per context position (scores, and scores x V), and the LM head
    for one row per request (a prefill's last token, a decode's token)."""
    families, events, _, llm_engine = run
    weights = dict(llm_engine.runner.model.named_parameters())
    layer_weights = sum(w.numel() for n, w in weights.items() if ".layers." in n and w.dim() == 2)
    o_projs = [w for n, w in weights.items() if n.endswith("o_proj.weight")]
    query_dims = sum(w.shape[1] for w in o_projs)  # q heads x head_dim, over the layers
    lm_head = weights["lm_head.weight"].numel()
    preempted = {(e.step, e.request_id) for e in events if e.kind == "request_preempted"}
    steps: dict[int, list] = {}
    for e in events:
        if e.kind == "request_scheduled" and (e.step, e.request_id) not in preempted:
            steps.setdefault(e.step, []).append(e)
    flops = 0
    for scheduled in steps.values():
        tokens = sum(e.num_tokens for e in scheduled)
        token_context = sum(
            e.num_tokens * (e.num_computed_tokens + e.num_tokens) for e in scheduled
        )
        flops += 2 * tokens * layer_weights + 4 * query_dims * token_context
        flops += 2 * len(scheduled) * lm_head
    assert value(families, "vllm:estimated_flops_per_gpu", "_total") == flops
    # Every weight is read at least once per step, and the new tokens' K and V are written.
    weight_bytes = (layer_weights + lm_head) * llm_engine.dtype.itemsize
    assert (
        value(families, "vllm:estimated_read_bytes_per_gpu", "_total") > len(steps) * weight_bytes
    )
    assert value(families, "vllm:estimated_write_bytes_per_gpu", "_total") > 0


@pytest.mark.parametrize("case", VLLM["perf"], ids=lambda c: f"{c['shape'][0]}L-{c['batch']}")
def test_step_estimate_equals_vllms(case):
    """perf.py's FLOPs and bytes equal vLLM's own estimate (recorded from vllm/v1/metrics/perf.py)
    for the same shape, tensor parallelism and batch."""
    L, D, q, kv, d, inter, V, b, tp = case["shape"]
    args = SimpleNamespace(
        num_hidden_layers=L, hidden_size=D, num_attention_heads=q, num_key_value_heads=kv,
        head_dim=d, intermediate_size=inter, vocab_size=V,
    )  # fmt: skip
    perf = ModelShape.of(args, b, tp).step([tuple(r) for r in case["batch"]])
    assert (perf.flops, perf.read_bytes, perf.write_bytes) == (
        case["num_flops"],
        case["read_bytes"],
        case["write_bytes"],
    )


def test_every_counter_has_its_created_series(server):
    """prometheus_client gives each counter a `_created` series (its start time), and vLLM's
    /metrics, served by it, has one for every counter; the engine's figures too (issue 60)."""
    text = httpx.get(server.url + "/metrics").text
    families = list(text_string_to_metric_families(text))
    # (In the text format a `_created` series parses as a family of its own.)
    names = {s.name for f in families for s in f.samples}
    counters = [f.name for f in families if f.type == "counter"]
    assert len(counters) > 10
    assert [c for c in counters if c + "_created" not in names] == []
