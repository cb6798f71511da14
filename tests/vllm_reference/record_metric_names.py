"""Record vLLM's Prometheus metric families (name, type, label names, buckets), as a test oracle.

Run with the Python of vLLM's own virtualenv (nanovllm/bench/README.md shows how to make one):

    ~/vllm-venv/bin/python tests/vllm_reference/record_metric_names.py \\
        tests/vllm_reference/metric_families.json

It starts vLLM's own `PrometheusStatLogger` (`vllm/v1/metrics/loggers.py`, the logger behind
`vllm serve`'s `/metrics`) on a stand-in config with every optional family switched on
(speculative decoding, a KV-consumer connector, KV cache residency metrics, LoRA, watermarking,
NaN counting), and writes each `vllm:` family prometheus_client's registry then holds: its
name as exposed (`_total` is a counter's sample suffix, not part of the family's name), type,
label names and, for a histogram, its bucket bounds (`max_model_len` 1024 sizes the token
buckets). `tests/serve/test_serve_vllm_metrics.py` compares nanovllm's `/metrics` with it.
"""

import json
import os
import sys
from types import SimpleNamespace as NS

MAX_MODEL_LEN = 1024


def main() -> None:
    os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1"  # the corrupted_requests counter
    import prometheus_client
    import vllm
    from vllm.config import CacheConfig
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
    families = {}
    for metric in prometheus_client.REGISTRY.collect():
        if not metric.name.startswith("vllm:"):
            continue
        labels = sorted({k for s in metric.samples for k in s.labels} - {"le"})
        family = {"type": metric.type, "labels": labels}
        if metric.type == "histogram":
            bounds = {s.labels["le"] for s in metric.samples if s.name.endswith("_bucket")}
            family["buckets"] = sorted(float(b) for b in bounds if b != "+Inf")
        families[metric.name] = family
    doc = {"vllm_version": vllm.__version__, "max_model_len": MAX_MODEL_LEN, "families": families}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(families)} families from vLLM {vllm.__version__} -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
