"""`--plot out.png`: throughput by engine, latency CDFs and nanovllm's KV usage per step.

One row of three panels per model:

1. output tokens/s by engine: the median as a bar, min-max over repeats as an error bar, and
   the roofline's ceiling as a dotted line;
2. latency CDFs: TTFT (solid) and inter-token latency (dashed) for every engine, log time;
3. KV slots over nanovllm's first timed run, per step: allocated, holding KV, and what
   reserving `max_model_len` contiguously for the same running requests would take.

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
    for (bars, cdfs, kv), m in zip(axes, models):
        engines = {k: e for k, e in m["engines"].items() if "tok_s" in e}
        color = {name: colors[i % len(colors)] for i, name in enumerate(engines)}

        names = list(engines)
        med = [engines[n]["tok_s"]["median"] for n in names]
        lo = [med[i] - engines[n]["tok_s"]["min"] for i, n in enumerate(names)]
        hi = [engines[n]["tok_s"]["max"] - med[i] for i, n in enumerate(names)]
        bars.bar(names, med, yerr=[lo, hi], capsize=4, color=[color[n] for n in names])
        for i, v in enumerate(med):
            bars.annotate(f"{v:,.0f}", (i, v + hi[i]), ha="center", va="bottom", fontsize=8)
        bars.axhline(m["roofline"]["ceiling_tok_s"], ls=":", c="grey", label="roofline ceiling")
        bars.legend(fontsize=8)
        bars.set_title(f"{m['model']['name']}: output tokens/s (median, min-max)")
        bars.tick_params(axis="x", labelrotation=20)

        for name, e in engines.items():
            for key, style in (("ttft", "-"), ("itl", "--")):
                xs = e["cdf"][key]
                if xs:
                    q = [x / 100 for x in e["cdf"]["q"]]
                    cdfs.plot(
                        [max(x, 1e-5) for x in xs],
                        q,
                        style,
                        c=color[name],
                        label=f"{name} {key.upper()}",
                    )
        cdfs.set_xscale("log")
        cdfs.set(
            xlabel="seconds", ylabel="fraction", title="latency CDF: TTFT (solid), ITL (dashed)"
        )
        cdfs.legend(fontsize=7, ncol=2)

        if "memory" not in m:
            kv.set_axis_off()
            continue
        series = m["memory"]["series"]
        kv.plot(series["step"], series["allocated"], label="allocated (paged)")
        kv.plot(series["step"], series["filled"], label="holding KV")
        kv.plot(
            series["step"],
            [n * m["max_model_len"] for n in series["running"]],
            ls="--",
            label="contiguous max_model_len",
        )
        kv.set(xlabel="step", ylabel="KV slots", ylim=(0, None))
        kv.set_title(f"nanovllm KV slots (capacity {m['memory']['capacity_slots']:,})")
        kv.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
