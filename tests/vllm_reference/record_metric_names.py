"""Record vLLM's Prometheus metric families (name, type, label names, buckets), as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_metric_names.py \\
        tests/vllm_reference/metric_families.json

It starts vLLM's own `PrometheusStatLogger` (`vllm/v1/metrics/loggers.py`, the logger behind
`vllm serve`'s `/metrics`) on a stand-in config with every optional family switched on
(speculative decoding, a KV-consumer connector, KV cache residency metrics, LoRA, watermarking,
NaN counting), and the tool-call parser's counter (`vllm/parser/metrics.py`, registered by
`vllm serve --tool-call-parser`), and writes each `vllm:` family prometheus_client's registry
then holds: its name as exposed (`_total` is a counter's sample suffix, not part of the family's
name), type, HELP text, label names and, for a histogram, its bucket bounds (`max_model_len`
1024 sizes the token buckets). `tests/serve/test_serve_vllm_metrics.py` compares nanovllm's `/metrics` with it.

It also records vLLM's estimate of a step's FLOPs and bytes (`vllm/v1/metrics/perf.py`: its
attention, MLP and LM-head components, summed, per GPU) for a few model shapes and batches, the
oracle of nanovllm's `nanovllm/serve/perf.py`.
"""

import json
import os
import sys
from types import SimpleNamespace as NS

MAX_MODEL_LEN = 1024
# (layers, hidden, heads, kv heads, head dim, intermediate, vocab, bytes, tensor parallel)
PERF_SHAPES = [(2, 64, 4, 2, 16, 128, 320, 4, 1), (28, 1024, 16, 8, 128, 3072, 151936, 2, 2)]
# Batches: (tokens, context length after them, is a prefill) per request.
PERF_BATCHES = [
    [(13, 13, True)],
    [(1, 17, False), (1, 40, False), (5, 21, True)],
    [(256, 512, True), (1, 1000, False)],
]


def perf_cases() -> list[dict]:
    from vllm.v1.metrics.perf import (
        AttentionMetrics,
        ExecutionContext,
        FfnMetrics,
        UnembedMetrics,
    )

    cases = []
    for L, D, q, kv, d, inter, V, b, tp in PERF_SHAPES:
        common = dict(num_hidden_layers=L, hidden_size=D, activation_byte_size=b, pp_size=1)
        components = [
            AttentionMetrics(
                **common, num_attention_heads=q, tp_size=tp, num_key_value_heads=kv,
                head_dim=d, cache_byte_size=b, weight_byte_size=b,
            ),
            FfnMetrics(
                **common, ffn_tp_size=tp, ffn_ep_size=1, intermediate_size=inter,
                num_moe_layers=0, weight_byte_size=b,
            ),
            UnembedMetrics(
                hidden_size=D, vocab_size=V, weight_byte_size=b, activation_byte_size=b,
                tp_size=tp,
            ),
        ]  # fmt: skip
        for batch in PERF_BATCHES:
            ctx = ExecutionContext()
            for n, c, prefill in batch:
                ctx.add(n, c, prefill)
            totals = {
                what: sum(
                    sum(getattr(m, f"get_{what}_breakdown")(ctx).values()) for m in components
                )
                for what in ("num_flops", "read_bytes", "write_bytes")
            }
            cases.append({"shape": [L, D, q, kv, d, inter, V, b, tp], "batch": batch, **totals})
    return cases


def main() -> None:
    os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1"  # the corrupted_requests counter
    import prometheus_client
    import vllm
    from vllm.config import CacheConfig
    from vllm.parser.metrics import init_parser_metrics
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    config = NS(
        observability_config=NS(
            show_hidden_metrics=False, kv_cache_metrics=True, custom_histogram_buckets=None
        ),
        model_config=NS(served_model_name="m", max_model_len=MAX_MODEL_LEN, is_diffusion=False),
        speculative_config=NS(num_speculative_tokens=2),
        kv_transfer_config=NS(is_kv_consumer=True, kv_connector=None),
        ec_transfer_config=None,
        watermark_config=NS(),
        lora_config=NS(max_loras=1),
        cache_config=CacheConfig(),  # cache_config_info: its labels
    )
    logger = PrometheusStatLogger(config)
    logger.log_engine_initialized()
    init_parser_metrics(model_name="m")
    families = {}
    for metric in prometheus_client.REGISTRY.collect():
        if not metric.name.startswith("vllm:"):
            continue
        labels = sorted({k for s in metric.samples for k in s.labels} - {"le"})
        family = {"type": metric.type, "help": metric.documentation, "labels": labels}
        if metric.type == "histogram":
            bounds = {s.labels["le"] for s in metric.samples if s.name.endswith("_bucket")}
            family["buckets"] = sorted(float(b) for b in bounds if b != "+Inf")
        families[metric.name] = family
    doc = {
        "vllm_version": vllm.__version__,
        "max_model_len": MAX_MODEL_LEN,
        "families": families,
        "perf": perf_cases(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(families)} families from vLLM {vllm.__version__} -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
