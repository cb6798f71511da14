"""Planted bugs the test suite must catch.

Each entry is a small, plausible mistake in the engine's source, and the tests that must fail
once it is planted. `test_planted_bugs.py` plants each one in a copy of the package and runs
those tests: a bug they miss is a hole in the suite.

An entry names the function the bug lives in (`function`, `Class.method`, `outer.inner`, or a
module- or class-level name bound by an assignment) and edits that function's *normal form*:
its source as `ast.unparse` prints it, with the `def` at column 0 (so a method's body is
indented 4), one statement per line, strings in single quotes, no comments. Each edit's old
text occurs exactly once there. The normal form depends on the syntax tree alone, so a bug
keeps working when the file is reformatted, its comments change, or the function moves within
its file (`planting.py` says how it is planted; `test_planted_bugs.py` plants every bug in a
copy of the tree reformatted at other line lengths). To see a function's normal form, from
the repository root:

    python tests/planting.py nanovllm/core/scheduler.py Scheduler.preempt

Old-form entries (exact text of the file, no `function`) are converted by
`tests/tools/convert_planted_bugs.py` (its docstring says how).

Several of these once survived the suite: Qwen3's q/k norm after RoPE (invisible while every
norm weight was 1.0), a rollback that skips blocks shared within the step, and a request reading
a block shared in the same step before that step's writes (no test admitted two requests with
the same prefix in one step). If a refactor changes the code an entry edits, the check fails
with "not defined" or "occurs 0 times": rewrite the entry for the new code; never delete it to
make the suite pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlantedBug:
    name: str
    file: str  # relative to the repository root
    function: str  # the qualified name of the function (or class, or assignment) it edits
    edits: tuple[tuple[str, str], ...]  # (old text of its normal form, found once; new text)
    tests: tuple[str, ...]  # pytest arguments selecting the tests that must fail
    why: str = ""  # required: the default only lets an old-form entry (5 fields) say so below

    def __post_init__(self) -> None:
        if not isinstance(self.function, str) or not all(
            isinstance(old, str) and isinstance(new, str) for old, new in self.edits
        ):
            raise TypeError(
                f"{self.name}: an old-form entry (no function named): convert it with "
                "tests/tools/convert_planted_bugs.py"
            )
        if not self.why:
            raise TypeError(f"{self.name}: say why the suite must catch it")


PLANTED_BUGS = [
    PlantedBug(
        "qwen3-qk-norm-after-rope",
        "nanovllm/models/llama.py",
        "Attention.qkv",
        (
            (
                "    if self.qk_norm:\n"
                "        q, k = (self.q_norm(q), self.k_norm(k))\n"
                "    q, k = rotary(positions, q, k)\n",
                "    q, k = rotary(positions, q, k)\n"
                "    if self.qk_norm:\n"
                "        q, k = (self.q_norm(q), self.k_norm(k))\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and qwen3"),
        "RoPE rotates; a norm with unit weights commutes with it. Random norm weights do not.",
    ),
    PlantedBug(
        "rollback-skips-blocks-shared-in-the-step",
        "nanovllm/core/block_pool.py",
        "BlockPool.uncache_step_blocks",
        (
            (
                "        if block.block_hash == block_hash:\n",
                "        if block.block_hash == block_hash and block.ref_cnt == 1:\n",
            ),
        ),
        ("tests/test_scheduler.py", "-k", "TestScheduler or failed_step_uncaches"),
        "A block another request of the same step hit has ref_cnt 2; its KV is still unwritten.",
    ),
    PlantedBug(
        "attention-reads-a-shared-block-before-the-steps-writes",
        "nanovllm/models/attention.py",
        "TorchAttention.forward",
        (
            (
                "    store_kv(k, v, key_cache, value_cache, meta.slot_mapping)\n",
                "    key_before, value_before = (key_cache.clone(), value_cache.clone())\n"
                "    store_kv(k, v, key_cache, value_cache, meta.slot_mapping)\n",
            ),
            (
                "            ctx_k, ctx_v = gather_context(key_cache, value_cache, "
                "meta.block_tables[i], seq_len)\n",
                "            ctx_k, ctx_v = gather_context(key_before, value_before, "
                "meta.block_tables[i], seq_len)\n"
                "            ctx_k = torch.cat((ctx_k[:seq_len - q_len], k[rows]))\n"
                "            ctx_v = torch.cat((ctx_v[:seq_len - q_len], v[rows]))\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and llama-gqa2"),
        "The cached context is read as it was before this step; another request fills it now.",
    ),
    PlantedBug(
        "decode-values-not-masked",
        "nanovllm/models/attention.py",
        "TorchAttention._decode",
        (
            (
                "    values = values.masked_fill(invalid[:, :, None, None], 0.0)\n",
                "",
            ),
        ),
        ("tests/test_robustness.py", "-k", "nan_left_in_stale_slots"),
        "Masked scores give weight 0, but 0 x NaN is NaN.",
    ),
    PlantedBug(
        "decode-attends-one-slot-too-many",
        "nanovllm/models/attention.py",
        "TorchAttention._decode",
        (
            (
                "    invalid = kv_pos >= seq_lens[:, None]\n",
                "    invalid = kv_pos > seq_lens[:, None]\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and llama-gqa2"),
        "An off-by-one in the decode mask reads one stale slot.",
    ),
    PlantedBug(
        "slot-mapping-off-by-one",
        "nanovllm/backends/input_batch.py",
        "InputBatch.prepare",
        (
            (
                "+ positions",
                "+ (positions + 1)",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and llama-gqa2"),
        "Each token's K/V lands in its neighbour's slot.",
    ),
    PlantedBug(
        "greedy-fast-path-takes-the-last-of-tied-maxima",
        "nanovllm/backends/sampler.py",
        "fast_greedy_tokens",
        (
            (
                "        argmax = rows.argmax(axis=1)\n",
                "        argmax = rows.shape[1] - 1 - rows[:, ::-1].argmax(axis=1)\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "greedy_tokens"),
        "Tied logits pick another token than torch (and transformers) would.",
    ),
    PlantedBug(
        "reference-slot-mapping-off-by-one",
        "nanovllm/executor/step_inputs.py",
        "step_metadata",
        (
            (
                "+ pos",
                "+ (pos + 1)",
            ),
        ),
        ("tests/test_input_batch.py",),
        "The plain step builder (the draft model's, the lessons') disagrees with the engine's.",
    ),
    PlantedBug(
        "persistent-batch-rewrites-only-appended-blocks",
        "nanovllm/backends/input_batch.py",
        "InputBatch._write_row",
        (
            (
                "    while first < common and old[first] == table[first]:\n        first += 1\n",
                "    first = common\n",
            ),
        ),
        ("tests/test_input_batch.py",),
        "A table that lost its last block and took another keeps the stale block id.",
    ),
    PlantedBug(
        "rotate-half-sign",
        "nanovllm/models/rotary.py",
        "rotate_half",
        (
            (
                "    return torch.cat((-x2, x1), dim=-1)\n",
                "    return torch.cat((x2, -x1), dim=-1)\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and llama-gqa2"),
        "RoPE rotating the wrong way.",
    ),
    PlantedBug(
        "free-queue-returns-blocks-to-the-head",
        "nanovllm/core/free_block_queue.py",
        "FreeBlockQueue.append",
        (
            (
                "    last = self._tail.prev_free\n"
                "    assert last is not None\n"
                "    last.next_free = block\n"
                "    block.prev_free = last\n"
                "    block.next_free = self._tail\n"
                "    self._tail.prev_free = block\n",
                "    first = self._head.next_free\n"
                "    assert first is not None\n"
                "    first.prev_free = block\n"
                "    block.next_free = first\n"
                "    block.prev_free = self._head\n"
                "    self._head.next_free = block\n",
            ),
        ),
        ("tests/test_kv_cache_manager.py",),
        "Most recently freed evicted first: the opposite of LRU.",
    ),
    PlantedBug(
        "preemption-keeps-num-computed-tokens",
        "nanovllm/core/scheduler.py",
        "Scheduler.preempt",
        (
            (
                "    request.num_computed_tokens = 0\n",
                "",
            ),
        ),
        ("tests/test_scheduler.py",),
        "A preempted request lost its blocks but believes its KV is still cached.",
    ),
    PlantedBug(
        "detokenizer-window-starts-at-the-output",
        "nanovllm/engine/detokenizer.py",
        "DetokenizerState.after_prompt",
        (
            (
                "return cls(prefix_offset=max(n - PROMPT_CONTEXT_TOKENS, 0),",
                "return cls(prefix_offset=n,",
            ),
        ),
        ("tests/test_detokenizer.py",),
        "A Metaspace tokenizer drops the first decoded token's leading space.",
    ),
    PlantedBug(
        "eos-ignores-generation-config",
        "nanovllm/engine/eos.py",
        "eos_token_ids",
        (
            (
                "            ids |= "
                "_as_ids(json.loads(generation_config.read_text()).get('eos_token_id'))\n",
                "            pass\n",
            ),
        ),
        ("tests/test_eos.py",),
        "A chat model's end-of-turn id is often only in generation_config.json.",
    ),
    PlantedBug(
        "min-p-after-top-k",
        "nanovllm/executor/sampler.py",
        "apply_filters",
        (
            (
                "    logits = logits.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, "
                "keepdim=True), neg_inf)\n",
                "",
            ),
            (
                "    sorted_logits = sorted_logits.masked_fill(drop, neg_inf)\n",
                "    drop |= probs < min_p[:, None] * probs[:, :1]\n"
                "    sorted_logits = sorted_logits.masked_fill(drop, neg_inf)\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "vllm_keeps"),
        "vLLM applies min-p first; top-p then sees the renormalised survivors.",
    ),
    PlantedBug(
        "top-k-drops-ties",
        "nanovllm/executor/sampler.py",
        "apply_filters",
        (
            (
                "    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)\n",
                "    ranks = torch.arange(logits.shape[-1], device=logits.device)\n"
                "    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], "
                "neg_inf)\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "tied"),
        "vLLM keeps every token tied with the k-th.",
    ),
    PlantedBug(
        "one-generator-for-every-request",
        "nanovllm/executor/random_draw.py",
        "exponential_race",
        (
            (
                "        noise[row].exponential_(generator=generator)\n",
                "        noise[row].exponential_(generator=generators[0])\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "whatever_shares"),
        "A seeded request's draws must not depend on its neighbours.",
    ),
    PlantedBug(
        "hashed-gumbel-noise-without-the-token-index",
        "nanovllm/executor/random_draw.py",
        "gumbel_noise",
        (
            (
                "    bits = _shift_right(splitmix64(key + i * GOLDEN_GAMMA), 11)\n",
                "    bits = _shift_right(splitmix64(key + GOLDEN_GAMMA), 11)\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "vllms_cpu_kernel or follow_the_distribution"),
        "One noise value for every token is a plain argmax: the draw is no longer random.",
    ),
    PlantedBug(
        "seeded-draw-takes-its-step-seed-from-the-global-generator",
        "nanovllm/executor/random_draw.py",
        "hashed_gumbel_max",
        (
            (
                "    seeds = torch.cat([torch.randint(0, 2 ** 31, (1,), generator=g) for g "
                "in generators])\n",
                "    seeds = torch.cat([torch.randint(0, 2 ** 31, (1,)) for g in generators])\n",
            ),
        ),
        ("tests/test_seeded_like_vllm.py",),
        "vLLM's CPU build takes each step's noise seed from the request's own generator.",
    ),
    PlantedBug(
        "abort-outputs-lost-when-a-step-fails",
        "nanovllm/engine/llm_engine.py",
        "LLMEngine.step",
        (
            (
                "    outputs = self._step_fn()\n    ready, self.outbox = (self.outbox, [])\n",
                "    ready, self.outbox = (self.outbox, [])\n    outputs = self._step_fn()\n",
            ),
        ),
        ("tests/test_robustness.py", "-k", "abort_output"),
        "An aborted request's final output must reach the caller.",
    ),
    PlantedBug(
        "children-share-one-seed",
        "nanovllm/engine/parallel_sampling.py",
        "child_params",
        (
            (
                "    seed = None if params.seed is None else (params.seed + index) % 2 ** 63\n",
                "    seed = params.seed\n",
            ),
        ),
        ("tests/test_parallel_sampling.py", "-k", "seed_plus_i"),
        "n children with one seed draw the same tokens n times.",
    ),
    PlantedBug(
        "rejected-proposals-stay-computed",
        "nanovllm/core/scheduler.py",
        "Scheduler.update_from_output",
        (
            (
                "            num_computed -= num_rejected\n",
                "",
            ),
        ),
        ("tests/test_spec_decode.py", "-k", "identical"),
        "The KV of a rejected proposal is wrong: num_computed_tokens must step back over it.",
    ),
    PlantedBug(
        "residual-keeps-the-rejected-token",
        "nanovllm/executor/rejection_sampler.py",
        "verify_random",
        (
            (
                "            residual[x] = 0.0\n",
                "",
            ),
        ),
        ("tests/test_spec_decode.py", "-k", "keeps_the_target_distribution"),
        "After a rejection, drawing from p itself over-weights the rejected token.",
    ),
    PlantedBug(
        "proposals-enter-the-prefix-cache",
        "nanovllm/core/kv_cache_manager.py",
        "KVCacheManager.allocate_slots",
        (
            (
                "    num_full = min(total_tokens, request.num_tokens) // self.block_size\n",
                "    num_full = total_tokens // self.block_size\n",
            ),
        ),
        ("tests/test_scheduler.py",),
        "A block full of proposals may be rejected; cached, it would serve wrong KV.",
    ),
    PlantedBug(
        "server-max-tokens-off-by-one",
        "nanovllm/serve/serving.py",
        "context_length_check.check",
        (
            (
                "    if room >= 1 and max_tokens > room:\n",
                "    if room >= 1 and max_tokens >= room:\n",
            ),
        ),
        ("tests/serve/test_serve_context_length.py", "-k", "boundary"),
        "prompt + max_tokens == max_model_len fits: the last token is sampled, never stored.",
    ),
    PlantedBug(
        "json-depth-counts-brackets-inside-strings",
        "nanovllm/serve/body.py",
        "_depths",
        (
            (
                "    steps[inside] = 0\n",
                "",
            ),
        ),
        ("tests/serve/test_serve_body.py", "-k", "json_depth_is_the_nesting"),
        'A prompt of "[[[[" is text, not nesting: a depth limit must not refuse it.',
    ),
    PlantedBug(
        "server-survives-a-dead-rank-as-500s",
        "nanovllm/serve/async_engine.py",
        "AsyncLLMEngine._step",
        (
            (
                "    except WorkerGroupError:\n        self._num_errors += 1\n        raise\n",
                "",
            ),
        ),
        ("tests/serve/test_serve_tp_fault.py", "-k", "mid-request"),
        "After a rank dies no step can run: 503 engine_unavailable, not a 500 per request.",
    ),
    PlantedBug(
        "proxy-waits-on-a-prefill-that-fails-its-health",
        "nanovllm/serve/disagg_proxy.py",
        "DisaggProxy._prefill_then_decode",
        (
            (
                "    if down is not None:\n",
                "    if False:\n",
            ),
        ),
        ("tests/serve/test_disagg_proxy.py", "-k", "hung or resumes"),
        "A stopped prefill answers nothing: every request would wait the whole prefill timeout.",
    ),
    PlantedBug(
        "drain-leaves-cut-streams-without-an-error-chunk",
        "nanovllm/serve/server.py",
        "Server.on_tick",
        (
            (
                "        if self.engine is not None and self.engine_dead is None:\n",
                "        if False:\n",
            ),
        ),
        ("tests/serve/test_serve_drain.py",),
        "A stream the drain window cuts must end with an error chunk and [DONE], not a break.",
    ),
    PlantedBug(
        "fused-rope-turns-the-key-the-wrong-way",
        "kernels/cpu_token_ops_numba.py",
        "rotary_and_store_kv",
        (
            (
                "                key_cache[block, offset, h, i + half] = "
                "x2 * cos[p, i + half] + x1 * sin[p, i + half]\n",
                "                key_cache[block, offset, h, i + half] = "
                "x2 * cos[p, i + half] - x1 * sin[p, i + half]\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_token_ops.py", "-k", "rotary_and_kv"),
        "The fused loop must rotate k as RoPE does before it writes it into the cache.",
    ),
    PlantedBug(
        "fused-rope-stores-keys-as-values",
        "kernels/cpu_token_ops_numba.py",
        "rotary_and_store_kv",
        (
            (
                "                value_cache[block, offset, h, d] = qkv[t, v_start + h * head_dim + d]\n",
                "                value_cache[block, offset, h, d] = qkv[t, k_start + h * head_dim + d]\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "cpu and llama-gqa2"),
        "v starts after q and k in the fused projection's output.",
    ),
    PlantedBug(
        "the-kernels-exp-has-a-wrong-coefficient",
        "kernels/cpu_paged_attention_numba.py",
        "exp_nonpositive",
        (
            (
                "    y = y * x + np.float32(0.041665795894)\n",
                "    y = y * x + np.float32(0.0425)\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention.py", "-k", "exp"),
        "An exp a hundred ulp off still passes attention's tolerance; the ulp test sees it.",
    ),
    PlantedBug(
        "freed-memory-given-back-to-the-kernel",
        "nanovllm/backends/cpu_malloc.py",
        "keep_freed_memory",
        (
            (
                "    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and "
                "mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))\n",
                "    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))\n",
            ),
        ),
        ("tests/test_cpu_malloc.py",),
        "Without the mmap threshold a chunk of a new size is mapped afresh and given back freed.",
    ),
    PlantedBug(
        "cpu-kernel-sees-one-key-too-many",
        "kernels/cpu_paged_attention_numba.py",
        "attend",
        (
            (
                "                end = min(block_size, q_pos + 1 - block_start)\n",
                "                end = min(block_size, q_pos + 2 - block_start)\n",
            ),
        ),
        ("tests/test_parity.py", "-k", "same_step and cpu and llama-gqa2"),
        "The in-place kernel attends one key past each query's own position.",
    ),
    PlantedBug(
        "cpu-kernel-forgets-to-rescale",
        "kernels/cpu_paged_attention_numba.py",
        "attend",
        (
            (
                "                for d in range(head_dim):\n"
                "                    acc[r, d] *= alpha\n",
                "",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention.py",),
        "The online softmax must rescale what it summed when the running max grows.",
    ),
    PlantedBug(
        "cpu-kernel-reads-a-value-twice-in-eight-keys",
        "kernels/cpu_paged_attention_numba.py",
        "accumulate_values",
        (
            (
                "            x += p7 * value_cache[block, t + 7, kv_head, d]\n",
                "            x += p7 * value_cache[block, t + 6, kv_head, d]\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention.py",),
        "The eighth key of a pass weights the seventh key's value.",
    ),
    PlantedBug(
        "cpu-kernel-skips-the-last-keys-after-four",
        "kernels/cpu_paged_attention_numba.py",
        "accumulate_values",
        (
            (
                "    while t < end:\n",
                "    while t < 0:\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention.py",),
        "Keys past the last whole group of four (visible % 4 of them) still count.",
    ),
    PlantedBug(
        "c-decode-kernel-takes-as-many-tokens-as-sequences-for-a-decode",
        "nanovllm/kernels/cpu_paged_attention_numba.py",
        "plan_attention",
        (
            (
                "num_tokens == len(seq_lens) and np.array_equal(query_start_loc, "
                "np.arange(len(query_start_loc), dtype=np.int32)))",
                "num_tokens == len(seq_lens))",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention_c.py",),
        "Three tokens for three sequences is not a decode when one sequence has two of them.",
    ),
    PlantedBug(
        "c-decode-kernel-serves-a-sliding-window",
        "nanovllm/kernels/cpu_paged_attention_c.py",
        "applies",
        (
            (
                " and (plan.sliding_window is None)",
                "",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_paged_attention_c.py",),
        "The C kernel has no window: a sliding layer's decode must stay with numba.",
    ),
    PlantedBug(
        "packed-linear-drops-the-bias",
        "nanovllm/backends/cpu_linear.py",
        "linear",
        (
            (
                "        return torch.ops.mkl._mkl_linear(x, packed.tensor, weight, bias, rows)\n",
                "        return torch.ops.mkl._mkl_linear(x, packed.tensor, weight, None, rows)\n",
            ),
        ),
        ("tests/test_cpu_linear.py", "-k", "packed_product"),
        "Qwen2's q/k/v have biases; the MKL path must add them as F.linear does. (The engine "
        "packs for MKL only on an Intel CPU, so the check multiplies through both libraries.)",
    ),
    PlantedBug(
        "packed-weights-made-from-uninitialised-weights",
        "nanovllm/backends/cpu_linear.py",
        "prepack_linear_weights",
        (
            (
                "            packed_weight = pack_weight(layer.weight.detach(), library)\n",
                "            packed_weight = pack_weight(torch.empty_like(layer.weight), library)\n",
            ),
        ),
        ("tests/test_cpu_linear.py",),
        "A packed copy is a snapshot: made from anything but the loaded checkpoint it never sees it.",
    ),
    PlantedBug(
        "the-mkl-check-never-compares-a-product",
        "nanovllm/backends/cpu_linear.py",
        "mkl_packs_for_any_rows",
        (
            (
                "            if not torch.allclose(y, F.linear(x, weight), rtol=1e-05, atol=1e-05):\n",
                "            if False:\n",
            ),
        ),
        ("tests/test_cpu_linear.py", "-k", "check_refuses"),
        "MKL does not document that one packing serves every row count: the engine must check it, "
        "and fall back to oneDNN where it does not.",
    ),
    PlantedBug(
        "a-dead-engines-answers-get-their-window-before-they-exist",
        "nanovllm/serve/server.py",
        "Server.on_tick",
        (
            (
                "            if self.engine.has_stopped() or now >= self.dead_at + STOP_WAIT_S:\n",
                "            if True:\n",
            ),
        ),
        ("tests/serve/test_serve_dead_rank_exit.py", "-k", "window"),
        "A rank's death is seen before the engine thread fails the streams: the window for their "
        "error to go out must start when it has, or a slow machine cuts the stream short.",
    ),
    PlantedBug(
        "rust-decode-ignores-skip-special-tokens",
        "nanovllm/engine/detokenizer.py",
        "rust_decoder",
        (
            (
                "    return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)\n",
                "    return lambda ids, skip: backend.decode(ids, skip_special_tokens=True)\n",
            ),
        ),
        ("tests/test_detokenizer.py",),
        "The request's skip_special_tokens must reach the Rust decode.",
    ),
    PlantedBug(
        "draft-model-skips-the-shadow-pass",
        "nanovllm/spec_decode/draft_executor.py",
        "DraftKVExecutor.execute",
        (
            (
                "    self.draft.forward_logits(*self.runner.last_inputs[:3], [])\n",
                "    pass\n",
            ),
        ),
        ("tests/test_draft_model.py", "-k", "continuation"),
        "Without its pass over every step's tokens the draft's KV cache is stale: its proposals "
        "stop being its own greedy continuation (the output stays right, so only that oracle "
        "sees it).",
    ),
    PlantedBug(
        "draft-proposes-every-token-at-the-same-position",
        "nanovllm/spec_decode/draft_model_proposer.py",
        "DraftModelProposer.propose",
        (
            (
                "        positions = [requests[i].num_tokens - 1 + j for i in active]\n",
                "        positions = [requests[i].num_tokens - 1 for i in active]\n",
            ),
        ),
        ("tests/test_draft_model.py", "-k", "continuation"),
        "Each proposal sits one position after the one before, in RoPE and in the KV slots.",
    ),
    PlantedBug(
        "rejected-proposals-free-the-lookahead-slots",
        "nanovllm/core/extra_tokens.py",
        "ExtraTokens.tokens_rejected",
        (
            (
                "    free_slots_from(kv, request, num_computed, self.num_slots_after)\n",
                "    free_slots_from(kv, request, num_computed)\n",
            ),
        ),
        ("tests/test_scheduler.py", "-k", "lookahead"),
        "After a rejection the request must still hold k slots past its newest token for the "
        "draft to write into.",
    ),
    PlantedBug(
        "compiled-regions-specialise-on-the-batch-size",
        "nanovllm/backends/compilation.py",
        "_warm_up",
        (
            (
                "            torch._dynamo.decorators.mark_unbacked(tensor, 0)\n",
                "            pass\n",
            ),
        ),
        ("tests/test_compile.py", "-k", "bounded"),
        "The flat batch changes size every step: a graph specialised on the warm-up's size "
        "recompiles during the run.",
    ),
    PlantedBug(
        "delta-outputs-repeat-a-quiet-childs-last-delta",
        "nanovllm/engine/parallel_sampling.py",
        "ParentRequest.output",
        (
            (
                "        moved.update(text='', token_ids=[], logprobs=self._no_logprobs())\n",
                "        pass\n",
            ),
        ),
        ("tests/test_output_kinds.py", "-k", "add_up"),
        "With DELTA outputs and n > 1, a child that did not move this step added nothing: its "
        "completion must be empty, not the previous step's delta again.",
    ),
    PlantedBug(
        "final-only-outputs-built-every-step",
        "nanovllm/engine/output_processor.py",
        "OutputProcessor.make_request_outputs",
        (
            (
                "and (not request.is_finished):",
                "and False:",
            ),
        ),
        ("tests/test_output_kinds.py", "-k", "add_up or generate_asks"),
        "FINAL_ONLY means one output per request, when it finishes (and no work before).",
    ),
    PlantedBug(
        "numba-rope-turns-the-second-half-the-wrong-way",
        "kernels/cpu_token_ops_numba.py",
        "_rotate",
        (
            (
                "            x[t, h, i + half] = x2 * cos[p, i + half] + x1 * sin[p, i + half]\n",
                "            x[t, h, i + half] = x2 * cos[p, i + half] - x1 * sin[p, i + half]\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_token_ops.py", "-k", "rotary"),
        "rotate_half is (-x2, x1): the second half gains x1 * sin.",
    ),
    PlantedBug(
        "numba-rms-norm-forgets-eps",
        "kernels/cpu_token_ops_numba.py",
        "_rms_norm_row",
        (
            (
                "    inv_rms = np.float32(1.0) / np.sqrt(sum_sq / np.float32(hidden) + "
                "np.float32(eps))\n",
                "    inv_rms = np.float32(1.0) / np.sqrt(sum_sq / np.float32(hidden))\n",
            ),
        ),
        ("tests/kernels/test_kernel_cpu_token_ops.py", "-k", "rms_norm"),
        "eps is part of the norm (0.1 in the test's draws), not only a guard against zero.",
    ),
    PlantedBug(
        "cuda-graph-padding-keeps-stale-slots",
        "nanovllm/backends/cuda_graphs.py",
        "DecodeGraphs.run",
        (
            (
                "    self.slot_mapping[n:batch_size].fill_(-1)\n",
                "",
            ),
        ),
        ("tests/kernels/test_kernel_decode_graphs.py", "-k", "replay_equals"),
        "A smaller step after a larger one: its padding rows would write K/V into the larger "
        "step's slots, other requests' cache.",
    ),
    PlantedBug(
        "block-ids-kept-after-proposals-are-rejected",
        "nanovllm/core/extra_tokens.py",
        "free_slots_from",
        (
            (
                "            kv.req_to_block_ids.pop(req_id, None)\n",
                "            pass\n",
            ),
        ),
        ("tests/test_scheduler.py", "-k", "rejection_keeps or TestScheduler"),
        "The table shrank and may grow back to the same length with another last block: the "
        "scheduler would hand out the old ids, and the step would write into a freed block.",
    ),
    PlantedBug(
        "block-ids-kept-when-the-table-grows",
        "nanovllm/core/kv_cache_manager.py",
        "KVCacheManager.allocate_slots",
        (
            (
                "    if num_to_take or len(hits[0]):\n        self.req_to_block_ids.pop(req_id, None)\n",
                "    if num_to_take or len(hits[0]):\n        pass\n",
            ),
        ),
        ("tests/test_kv_cache_manager.py",),
        "A request's new block would be missing from the table the scheduler sends.",
    ),
    PlantedBug(
        "greedy-shortcut-ignores-nan-rows",
        "nanovllm/backends/sampler.py",
        "FastSampler.__call__",
        (
            (
                "        if not bad.any():\n",
                "        if True:\n",
            ),
        ),
        ("tests/test_sampler.py", "-k", "greedy_batch"),
        "A NaN row's argmax is a token too; it must fail alone, not be emitted.",
    ),
    PlantedBug(
        "greedy-shortcut-drops-logprobs",
        "nanovllm/backends/sampler.py",
        "_plain_greedy",
        (
            (
                "all((r.sampling_params.greedy and r.sampling_params.logprobs is None for",
                "all((r.sampling_params.greedy for",
            ),
        ),
        ("tests/test_sampler.py", "-k", "greedy_batch"),
        "Greedy requests may ask for logprobs; the shortcut returns none.",
    ),
    PlantedBug(
        "staging-hands-out-the-reused-buffer",
        "nanovllm/backends/staging.py",
        "InputStaging.to_device",
        (
            (
                "    on_device.copy_(self.buffer[:end], non_blocking=self.pinned)\n",
                "    on_device = self.buffer[:end]\n",
            ),
        ),
        ("tests/test_staging.py",),
        "A step's inputs must not be views of the buffer the next step rewrites.",
    ),
    PlantedBug(
        "kv-budget-forgets-the-graphs-pool",
        "nanovllm/executor/memory.py",
        "budget_from_profile",
        (
            (
                "    return int(total * utilization) - in_use - activation_peak - graph_pool\n",
                "    return int(total * utilization) - in_use - activation_peak\n",
            ),
        ),
        ("tests/test_loading.py", "-k", "left_after"),
        "Captured after the cache takes its share, the graphs' pool must have been set aside.",
    ),
    PlantedBug(
        "staged-metadata-left-on-the-host",
        "nanovllm/backends/cuda_runner.py",
        "CudaModelRunner.inputs_on_device",
        (
            (
                "    return (input_ids, positions, dataclasses.replace(meta, **named), "
                "logits_rows)\n",
                "    return (input_ids, positions, meta, logits_rows)\n",
            ),
        ),
        ("tests/test_staging.py", "-k", "runner"),
        "The attention metadata must reach the GPU with the step's other inputs.",
    ),
    PlantedBug(
        "profile-step-shares-its-blocks",
        "nanovllm/backends/gpu_memory.py",
        "profile_step",
        (
            (
                "        first_block += num_blocks\n",
                "        first_block += 0\n",
            ),
        ),
        ("tests/test_loading.py", "-k", "profile_step"),
        "The budget's measuring step must hold the cache a real step of that size would.",
    ),
    PlantedBug(
        "the-plain-backend-packs-its-matmuls",
        "nanovllm/backends/__init__.py",
        "Backend.model_layers",
        (
            (
                "        return layers\n",
                "        from nanovllm.backends.cpu_linear import packed_layers\n"
                "        return packed_layers(layers)\n",
            ),
        ),
        ("tests/test_backends.py", "-k", "plain_pytorch"),
        'attention_backend="torch" is plain PyTorch throughout: no oneDNN-packed matmul.',
    ),
    PlantedBug(
        "the-cpu-backend-keeps-the-plain-norms",
        "nanovllm/backends/cpu.py",
        "numba_layers",
        (
            (
                "    return dataclasses.replace(layers, **fast)\n",
                "    return layers\n",
            ),
        ),
        ("tests/test_backends.py", "-k", "cpu_backend"),
        "The CPU backend's numba norms and RoPE are chosen once, at build time.",
    ),
    PlantedBug(
        "grammar-not-rolled-back-after-the-speculative-rows",
        "nanovllm/structured_output/manager.py",
        "grammar_bitmask",
        (
            (
                "        grammar.rollback(advanced)\n",
                "        pass\n",
            ),
        ),
        ("tests/test_structured_outputs.py", "-k", "speculative_rows"),
        "The proposals accepted to fill rows 1..k are tentative: the matcher must forget them.",
    ),
    PlantedBug(
        "grammar-mask-on-the-wrong-logits-row",
        "nanovllm/structured_output/manager.py",
        "grammar_bitmask",
        (
            (
                "            rows.append(first + j)\n",
                "            rows.append(len(rows))\n",
            ),
        ),
        ("tests/test_structured_outputs.py", "-k", "unconstrained_requests"),
        "A request's mask rows start at its own first logits row, not at the structured ones' count.",
    ),
    PlantedBug(
        "stale-proposals-kept-for-requests-that-stopped-decoding",
        "nanovllm/spec_decode/speculator.py",
        "Speculator.propose",
        (
            (
                "    self.proposals = propose_next_tokens(self.proposer, running, table_of)\n",
                "    self.proposals.update(propose_next_tokens(self.proposer, running, table_of))\n",
            ),
        ),
        ("tests/test_spec_decode.py", "-k", "replace_the_last"),
        "A preempted request would be asked for proposals made for a position it no longer has.",
    ),
    PlantedBug(
        "grammar-proposals-not-cut-to-what-the-grammar-allows",
        "nanovllm/spec_decode/propose.py",
        "propose_next_tokens",
        (
            (
                "    return {request.request_id: grammar_valid_prefix(request, proposal) for request, proposal in zip(decoding, proposals)}\n",
                "    return {request.request_id: proposal for request, proposal in zip(decoding, proposals)}\n",
            ),
        ),
        ("tests/test_structured_outputs.py", "-k", "speculative_rows"),
        "vLLM verifies only proposals the grammar allows; the others cost a row each for nothing.",
    ),
    PlantedBug(
        "presence-and-frequency-count-the-prompt",
        "nanovllm/executor/logits_processors.py",
        "_apply_penalties",
        (
            (
                "    counts = output_token_counts([rows[i][1] for i in using], vocab, device)\n",
                "    counts = output_token_counts([rows[i][0].prompt_token_ids + rows[i][1] "
                "for i in using], vocab, device)\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "definitions or alone"),
        "OpenAI's presence and frequency penalties count the output only; repetition's the prompt.",
    ),
    PlantedBug(
        "logit-bias-on-every-row",
        "nanovllm/executor/logits_processors.py",
        "_apply_logit_bias",
        (
            (
                "        logits[row_ids, token_ids] += bias_t\n",
                "        logits[:, token_ids] += bias_t\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "mixed_batch"),
        "One request's logit_bias must never touch another request's row of the batch.",
    ),
    PlantedBug(
        "verified-rows-forget-the-proposals-before-them",
        "nanovllm/executor/logits_processors.py",
        "apply_logits_processors",
        (
            (
                "            rows.append((request, request.output_token_ids + proposed[:j]))\n",
                "            rows.append((request, list(request.output_token_ids)))\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "definitions or speculative"),
        "Row j of a verifying request scores the token after its first j proposals.",
    ),
    PlantedBug(
        "min-tokens-one-too-many",
        "nanovllm/executor/logits_processors.py",
        "apply_logits_processors",
        (
            (
                "        if len(output) < request.sampling_params.min_tokens:\n",
                "        if len(output) <= request.sampling_params.min_tokens:\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "min_tokens"),
        "min_tokens tokens come out before a stop token may: the next one may stop.",
    ),
    PlantedBug(
        "prompt-logprob-rows-forget-the-chunk-start",
        "nanovllm/executor/prompt_logprobs.py",
        "prompt_logprob_rows",
        (
            (
                "            rows.extend(((request, offset + p - start, p) for p in "
                "range(start, end)))\n",
                "            rows.extend(((request, offset + p, p) for p in range(start, end)))\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "prompt_logprobs_match"),
        "A later chunk's rows start at its own first token, not at the prompt's.",
    ),
    PlantedBug(
        "prompt-logprobs-read-the-prefix-cache",
        "nanovllm/core/kv_cache_manager.py",
        "KVCacheManager.get_computed_blocks",
        (
            (
                "    if not self.enable_prefix_caching or "
                "request.sampling_params.prompt_logprobs is not None:\n",
                "    if not self.enable_prefix_caching:\n",
            ),
        ),
        ("tests/test_sampling_params_parity.py", "-k", "prefix_cache"),
        "A cached token is never computed, so its prompt logprob would be missing.",
    ),
    PlantedBug(
        "lesson-run-compares-who-ran-not-how-much",
        "lessons/compare.py",
        "_schedule",
        (
            (
                "        if want == got:\n",
                "        if (want is None) == (got is None):\n",
            ),
        ),
        ("tests/lessons/test_lesson_safety.py", "-k", "first_step_that_differs"),
        "--run compares each request's tokens per step: one token where it has five is a fault.",
    ),
    PlantedBug(
        "tier-loads-before-it-saves",
        "nanovllm/kv_transfer/offloading.py",
        "OffloadingConnector.start_load_kv",
        (
            (
                "    if meta.saves_before:\n"
                "        blocks, slots = self._indices(meta.saves_before, "
                "device_tensors[0].device)\n"
                "        for device, host in zip(device_tensors, host_tensors):\n"
                "            host[slots] = device[blocks].to('cpu')\n"
                "    if meta.loads:\n"
                "        blocks, slots = self._indices(meta.loads, "
                "device_tensors[0].device)\n"
                "        for device, host in zip(device_tensors, host_tensors):\n"
                "            device[blocks] = host[slots].to(device.device)\n",
                "    if meta.loads:\n"
                "        blocks, slots = self._indices(meta.loads, "
                "device_tensors[0].device)\n"
                "        for device, host in zip(device_tensors, host_tensors):\n"
                "            device[blocks] = host[slots].to(device.device)\n"
                "    if meta.saves_before:\n"
                "        blocks, slots = self._indices(meta.saves_before, "
                "device_tensors[0].device)\n"
                "        for device, host in zip(device_tensors, host_tensors):\n"
                "            host[slots] = device[blocks].to('cpu')\n",
            ),
        ),
        ("tests/test_kv_connector.py", "-k", "tier_serves or bit_for_bit or full_tier"),
        "A block evicted this step may be the block a load fills: its old KV must leave first.",
    ),
    PlantedBug(
        "external-tokens-get-no-slots",
        "nanovllm/core/kv_source.py",
        "ComputedPrefix.num_slots",
        (
            (
                "    return self.num_external + num_new_tokens\n",
                "    return num_new_tokens\n",
            ),
        ),
        ("tests/test_kv_connector.py", "-k", "tier_serves or bit_for_bit"),
        "Loaded tokens are not computed, but their KV still needs blocks to be copied into.",
    ),
    PlantedBug(
        "storage-load-trusts-the-file-name",
        "nanovllm/kv_transfer/shared_storage.py",
        "SharedStorageConnector.load_block",
        (
            (
                "    if tokens is None or tuple(tokens.tolist()) != t.token_ids:\n",
                "    if tokens is None:\n",
            ),
        ),
        ("tests/test_kv_connector.py", "-k", "failed_load"),
        "A file renamed, or written for other tokens, would serve the wrong KV without the check.",
    ),
    PlantedBug(
        "p2p-loads-k-into-v",
        "nanovllm/kv_transfer/p2p.py",
        "P2pConnector.start_load_kv",
        (
            (
                "        k_cache[block_ids] = torch.stack([b.kv[layer][0] for _, b in "
                "found]).to(k_cache)\n",
                "        k_cache[block_ids] = torch.stack([b.kv[layer][1] for _, b in "
                "found]).to(k_cache)\n",
            ),
        ),
        ("tests/test_kv_p2p.py", "-k", "receives_the_prompt"),
        "Received KV copied into the wrong half of the cache: only the decoded tokens show it.",
    ),
    PlantedBug(
        "p2p-disconnect-leaves-waiters-waiting",
        "nanovllm/kv_transfer/p2p_transport.py",
        "P2pTransport._run_session",
        (
            (
                "        self._end(tid, state, 'the producer disconnected before the transfer "
                "ended')\n",
                "        pass\n",
            ),
        ),
        ("tests/test_kv_p2p.py", "-k", "producer_killed"),
        "A dead producer's transfers would hold every waiting request until the timeout.",
    ),
    PlantedBug(
        "connector-saves-only-after-the-forward-pass",
        "nanovllm/kv_transfer/executor.py",
        "KVConnectorExecutor.__init__",
        (
            (
                "        layer.register_forward_hook(self._layer_done_hook(i))\n",
                "        pass\n",
            ),
        ),
        ("tests/test_kv_p2p.py", "-k", "each_layer"),
        "Every answer stays right; only the sends stop overlapping the later layers.",
    ),
]
