"""`--plot out.png`: throughput by engine, latency CDFs and nanovllm's KV usage over time.

One row of three panels per model:

1. output tokens/s by engine: the median as a bar, the min-max over repeats as an error bar;
2. latency CDFs: TTFT (solid) and inter-token latency (dashed) for every engine, log time;
3. KV slots over nanovllm's first run: allocated, holding KV, and what reserving
   `max_model_len` contiguously for the same running requests would take.

Drawn with matplotlib's Agg backend, so it works without a display.
"""

from __future__ import annotations


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    fig, axes = plt.subplots(len(models), 3, figsize=(17, 4.6 * len(models)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, m in zip(axes, models):
        engines = {k: e for k, e in m["engines"].items() if e.get("runs")}
        color = {name: colors[i % len(colors)] for i, name in enumerate(engines)}
        _throughput(row[0], m, engines, color)
        _cdfs(row[1], engines, color)
        _kv(row[2], m)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput(ax, m: dict, engines: dict, color: dict) -> None:
    names = list(engines)
    med = [engines[n]["tok_s"]["median"] for n in names]
    lo = [med[i] - engines[n]["tok_s"]["min"] for i, n in enumerate(names)]
    hi = [engines[n]["tok_s"]["max"] - med[i] for i, n in enumerate(names)]
    ax.bar(names, med, yerr=[lo, hi], capsize=4, color=[color[n] for n in names])
    for i, v in enumerate(med):
        ax.annotate(f"{v:,.0f}", (i, v + hi[i]), ha="center", va="bottom", fontsize=8)
    if "floor" in m:
        ax.axhline(m["floor"]["output_tokens_per_s"], ls=":", c="grey", label="linear floor")
        ax.legend(fontsize=8)
    ax.set_title(f"{m['model']['name']}: output tokens/s (median, min-max)")
    ax.tick_params(axis="x", labelrotation=20)


def _cdfs(ax, engines: dict, color: dict) -> None:
    for name, e in engines.items():
        cdf = e.get("cdf") or {}
        q = [x / 100 for x in cdf.get("q", [])]
        if cdf.get("ttft"):
            ax.plot([max(t, 1e-5) for t in cdf["ttft"]], q, c=color[name], label=f"{name} TTFT")
        if cdf.get("itl"):
            ax.plot(
                [max(t, 1e-5) for t in cdf["itl"]], q, c=color[name], ls="--", label=f"{name} ITL"
            )
    ax.set_xscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("fraction of requests / tokens")
    ax.set_title("latency CDF: TTFT (solid), inter-token (dashed)")
    ax.legend(fontsize=7, ncol=2)


def _kv(ax, m: dict) -> None:
    s = m.get("kv_series")
    if not s:
        ax.set_axis_off()
        return
    ax.plot(s["t"], s["allocated"], label="allocated (paged)")
    ax.plot(s["t"], s["filled"], label="holding KV")
    ax.plot(s["t"], s["contiguous"], ls="--", label="contiguous max_model_len")
    top = max(s["contiguous"] + s["allocated"] + [1])
    ax.set_ylim(0, top * 1.1)  # the whole KV capacity is usually far above; it is in the title
    ax.set_xlabel("seconds into nanovllm's run")
    ax.set_ylabel("KV slots")
    ax.set_title(f"nanovllm KV usage over time (capacity {m['memory']['capacity_slots']:,} slots)")
    ax.legend(fontsize=8)
