"""Speculative decoding, measured: nanovllm with and without it, on the same workload.

With `--speculative-config JSON` the reference engine, `nanovllm`, speculates, and
`nanovllm-no-spec` (the same engine without it) joins the timed repeats, interleaved with every
other engine, so both sides see the same machine. Figures per side, from those runs:

- **steps**: engine steps that ran the model, and **steps per output token**. Without
  speculation a running request gets one token per step it decodes in; with it, up to k + 1.
  Steps are counted over the whole run, all requests together (the median over repeats).
- **output tok/s**: the median over repeats (with min-max); the speed-up is with / without.
- from the speculating runs (summed over repeats): proposals verified (`num_drafts`), tokens
  proposed and accepted, the **acceptance rate** (accepted / proposed) and the **mean accepted
  length** (tokens per verifying step: 1 + accepted / verifications), `LLMEngine.stats.spec_decoding`'s
  definitions.
- greedy workloads: the agreement of the two sides' tokens (speculation must not change them).

Whether speculation pays depends on the text (how often n-grams repeat: the acceptance rate)
and on what a step with more tokens in it costs against one without them, which this comparison
measures rather than assumes.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanovllm.bench import stats
from nanovllm.bench.records import EngineRun

WITHOUT = "nanovllm-no-spec"  # the engine run beside the speculating reference


def side(runs: Sequence[EngineRun]) -> dict:
    """Steps, steps per output token and tok/s of one side's repeats."""
    steps = stats.summary([len(run.extra["steps"]) for run in runs])
    tokens = runs[0].num_output_tokens
    return {
        "steps": steps["median"],
        "output_tokens": tokens,
        "steps_per_output_token": steps["median"] / tokens if tokens else 0.0,
        "tok_s": stats.summary([run.output_tokens_per_s for run in runs]),
    }


def acceptance(runs: Sequence[EngineRun]) -> dict:
    """The speculating side's counts, summed over its runs, and the two rates made of them."""
    counts = {
        key: sum(run.extra["spec"][key] for run in runs)
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    drafts, proposed = counts["num_drafts"], counts["num_draft_tokens"]
    accepted = counts["num_accepted_tokens"]
    return {
        **counts,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "mean_accepted_length": 1 + accepted / drafts if drafts else 0.0,
    }


def compare(
    with_spec: Sequence[EngineRun], without: Sequence[EngineRun], greedy: bool, config: dict
) -> dict:
    """Both sides, their ratios, and the acceptance figures (see the module docstring)."""
    on, off = side(with_spec), side(without)
    return {
        "speculative_config": config,
        "with": on,
        "without": off,
        "speedup": on["tok_s"]["median"] / off["tok_s"]["median"]
        if off["tok_s"]["median"]
        else None,
        "steps_ratio": on["steps"] / off["steps"] if off["steps"] else None,
        **acceptance(with_spec),
        "agreement": stats.agreement(without[0], with_spec[0]) if greedy else None,
    }
