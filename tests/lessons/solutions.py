"""Worked solutions to the exercises, as the learner would write them (not the engine's code).

Each entry maps an exercise's `raise NotImplementedError(...)` line to the code that replaces it
(indented to match). `solve(lesson, folder)` writes the solved exercise file, so a test can check
that the shipped skeleton plus a plain, learner-style body passes the properties, through pytest
and `nanovllm lesson N --check` exactly as a learner would.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from nanovllm.lessons.catalog import Lesson

SOLUTIONS: dict[str, dict[str, str]] = {}


def solve(lesson: Lesson, folder: Path) -> Path:
    source = lesson.file("exercise.py").read_text()
    for stub, body in SOLUTIONS[lesson.name].items():
        pattern = re.compile(rf"^([ \t]*){re.escape(stub)}[^\n]*$", re.MULTILINE)
        match = pattern.search(source)
        assert match, f"{lesson.name}: no line starting with {stub!r}"
        code = textwrap.indent(textwrap.dedent(body).strip("\n"), match.group(1))
        source = source[: match.start()] + code + source[match.end() :]
    assert "NotImplementedError" not in source, f"{lesson.name}: a stub is left unsolved"
    path = folder / lesson.name / "exercise.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


SOLUTIONS["05_triton_kernel"] = {
    'raise NotImplementedError("write _store_kvcache_kernel': """
        token = tl.program_id(0)
        slot = tl.load(slot_mapping_ptr + token)
        if slot >= 0:
            offs = tl.arange(0, ROW)
            tl.store(key_cache_ptr + slot * ROW + offs, tl.load(key_ptr + token * ROW + offs))
            tl.store(value_cache_ptr + slot * ROW + offs, tl.load(value_ptr + token * ROW + offs))
    """,
    'raise NotImplementedError("write _paged_decode_kernel': """
        seq = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // (NUM_HEADS // NUM_KV_HEADS)
        seq_len = tl.load(seq_lens_ptr + seq)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(query_ptr + (seq * NUM_HEADS + head) * HEAD_DIM + dims).to(tl.float32)
        m = float("-inf")
        l = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        for start in range(0, seq_len, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            valid = pos < seq_len
            block = tl.load(block_tables_ptr + seq * max_blocks + pos // BLOCK_SIZE, mask=valid, other=0)
            row = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * NUM_KV_HEADS + kv_head
            addr = row[:, None] * HEAD_DIM + dims[None, :]
            k = tl.load(key_cache_ptr + addr, mask=valid[:, None], other=0.0).to(tl.float32)
            v = tl.load(value_cache_ptr + addr, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.where(valid, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            m = m_new
        tl.store(out_ptr + (seq * NUM_HEADS + head) * HEAD_DIM + dims, acc / l)
    """,
}


SOLUTIONS["01_kv_cache"] = {
    'raise NotImplementedError("write attention': """
        q_len, kv_len = q.shape[0], k.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
        q_pos = torch.arange(kv_len - q_len, kv_len)
        allowed = torch.arange(kv_len)[None, :] <= q_pos[:, None]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
    """,
    'raise NotImplementedError("write KVCache.append': """
        self.keys = torch.cat([self.keys, k])
        self.values = torch.cat([self.values, v])
    """,
    'raise NotImplementedError("write decode_step': """
        cache.append(k, v)
        return attention(q, cache.keys, cache.values, scale)
    """,
}

SOLUTIONS["02_paged_blocks"] = {
    'raise NotImplementedError("write blocks_needed': """
        return (num_tokens + block_size - 1) // block_size
    """,
    'raise NotImplementedError("write slot_for': """
        logical, offset = divmod(position, block_size)
        return block_table[logical] * block_size + offset
    """,
    'raise NotImplementedError("write slot_mapping': """
        return [slot_for(block_table, p, block_size) for p in range(start, end)]
    """,
}

SOLUTIONS["03_free_block_queue"] = {
    'raise NotImplementedError("write FreeBlockQueue.remove': """
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1
    """,
    'raise NotImplementedError("write FreeBlockQueue.popleft': """
        block = self._head.next_free
        if block is self._tail:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block
    """,
    'raise NotImplementedError("write FreeBlockQueue.append': """
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1
    """,
}

SOLUTIONS["04_paged_attention"] = {
    'raise NotImplementedError("write gather_kv': """
        block_size, num_kv_heads, head_dim = key_cache.shape[1:]
        blocks = torch.tensor(block_table[: -(-seq_len // block_size)])
        keys = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        values = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        return keys, values
    """,
    'raise NotImplementedError("write paged_decode': """
        keys, values = gather_kv(key_cache, value_cache, block_table, seq_len)
        group = query.shape[0] // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1).float()
        values = values.repeat_interleave(group, dim=1).float()
        probs = (torch.einsum("hd,lhd->hl", query.float(), keys) * scale).softmax(dim=-1)
        return torch.einsum("hl,lhd->hd", probs, values).to(query.dtype)
    """,
}

SOLUTIONS["06_continuous_batching"] = {
    'raise NotImplementedError("write schedule_step': """
        budget, scheduled = token_budget, {}
        for r in running:
            if budget == 0:
                break
            scheduled[r.id] = min(r.remaining, budget)
            budget -= scheduled[r.id]
        while waiting and budget > 0 and len(running) < max_num_seqs:
            if waiting[0].num_tokens > budget:
                break
            r = waiting.pop(0)
            running.append(r)
            scheduled[r.id] = r.num_tokens
            budget -= r.num_tokens
        return scheduled
    """,
}

SOLUTIONS["07_preemption"] = {
    'raise NotImplementedError("write schedule_step': """
        budget, scheduled, preempted = token_budget, {}, []
        free = num_blocks - sum(blocks_for(r.num_computed, block_size) for r in running)
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.remaining, budget)
            need = blocks_for(r.num_computed + n, block_size) - blocks_for(r.num_computed, block_size)
            while need > free:
                victim = running.pop()
                free += blocks_for(victim.num_computed, block_size)
                victim.num_computed = 0
                waiting.insert(0, victim)
                preempted.append(victim.id)
                if victim is r:
                    break
            if preempted and preempted[-1] == r.id:
                break
            free -= need
            scheduled[r.id] = n
            budget -= n
            i += 1
        while not preempted and waiting and budget > 0 and len(running) < max_num_seqs:
            r = waiting[0]
            need = blocks_for(r.num_tokens, block_size)
            if r.num_tokens > budget or need > free:
                break
            running.append(waiting.pop(0))
            scheduled[r.id] = r.num_tokens
            budget -= r.num_tokens
            free -= need
        return StepPlan(scheduled, preempted)
    """,
}

SOLUTIONS["08_prefix_caching"] = {
    'raise NotImplementedError("write hash_block_tokens': """
        digest = hashlib.sha256(parent_hash or b"\\0" * 32)
        for t in token_ids:
            digest.update(int(t).to_bytes(8, "little", signed=True))
        return digest.digest()
    """,
    'raise NotImplementedError("write block_hashes': """
        hashes, parent = [], None
        for i in range(len(token_ids) // block_size):
            parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
            hashes.append(parent)
        return hashes
    """,
    'raise NotImplementedError("write cached_prefix': """
        found = []
        for h in block_hashes(token_ids, block_size)[: (len(token_ids) - 1) // block_size]:
            if h not in cache:
                break
            found.append(cache[h])
        return found
    """,
}

SOLUTIONS["09_chunked_prefill"] = {
    'raise NotImplementedError("write schedule_step': """
        budget, scheduled = token_budget, {}
        for r in running:
            if budget == 0:
                break
            scheduled[r.id] = min(r.remaining, budget)
            budget -= scheduled[r.id]
        while waiting and budget > 0 and len(running) < max_num_seqs:
            r = waiting.pop(0)
            running.append(r)
            scheduled[r.id] = min(r.num_tokens, budget)
            budget -= scheduled[r.id]
        return scheduled
    """,
    'raise NotImplementedError("write prepare_inputs': """
        out = StepInputs([], [], [], [0], [], [])
        for seq in batch:
            c, n = seq.num_computed, seq.num_new
            for p in range(c, c + n):
                out.input_ids.append(seq.token_ids[p])
                out.positions.append(p)
                out.slot_mapping.append(seq.block_table[p // block_size] * block_size + p % block_size)
            out.query_start_loc.append(out.query_start_loc[-1] + n)
            out.seq_lens.append(c + n)
            if c + n == len(seq.token_ids):
                out.logits_rows.append(out.query_start_loc[-1] - 1)
        return out
    """,
}

SOLUTIONS["10_sampling_streaming"] = {
    'raise NotImplementedError("write apply_top_k': """
        kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]
        return logits.masked_fill(logits < kth, float("-inf"))
    """,
    'raise NotImplementedError("write apply_top_p': """
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = (probs.cumsum(dim=-1) - probs >= p) & (p < 1)
        masked = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.full_like(logits, float("-inf")).scatter(-1, order, masked)
    """,
    'raise NotImplementedError("write detokenize_step': """
        prefix_text = tokenizer.decode(output_ids[state.prefix_offset : state.read_offset])
        new_text = tokenizer.decode(output_ids[state.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        state.text += delta
        state.prefix_offset = state.read_offset
        state.read_offset = len(output_ids)
        return delta
    """,
}

SOLUTIONS["11_serving_benchmarking"] = {
    'raise NotImplementedError("write percentile': """
        if not values:
            return math.nan
        xs = sorted(values)
        pos = (len(xs) - 1) * q / 100
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    """,
    'raise NotImplementedError("write ttft': """
        return token_times[0] - arrival_s if token_times else None
    """,
    'raise NotImplementedError("write inter_token_latencies': """
        return [b - a for a, b in zip(token_times, token_times[1:])]
    """,
    'raise NotImplementedError("write sse_event': """
        return f"data: {json.dumps(payload, ensure_ascii=False)}\\n\\n"
    """,
}

SOLUTIONS["12_properties"] = {
    'raise NotImplementedError("write prop_free_queue': """
        blocks = [KVCacheBlock(i) for i in range(8)]
        queue, model = FreeBlockQueue(blocks), list(range(8))
        for op, block_id in script:
            if op == "popleft":
                assert queue.popleft().block_id == model.pop(0)
            elif op == "append":
                queue.append(blocks[block_id])
                model.append(block_id)
            else:
                queue.remove(blocks[block_id])
                model.remove(block_id)
            assert [b.block_id for b in queue.get_all_free_blocks()] == model
            assert queue.num_free_blocks == len(model)
    """,
    'raise NotImplementedError("write prop_allocator': """
        manager = make_manager(case.num_blocks, case.block_size)
        before = ({}, {}, case.num_blocks)  # tables, tokens, free blocks
        for snap in run_allocator_script(manager, case.script):
            owned = [b for table in snap.tables.values() for b in table]
            free = {b.block_id for b in manager.free_block_queue.get_all_free_blocks()}
            assert len(owned) == len(set(owned)) and not free & set(owned)
            assert manager.num_free_blocks + len(owned) == case.num_blocks
            for rid, table in snap.tables.items():
                assert len(table) == blocks_for(snap.tokens[rid], case.block_size)
            if not snap.ok:
                tables, tokens, num_free = before
                _, rid, n = snap.op
                need = blocks_for(tokens.get(rid, 0) + n, case.block_size) - len(tables.get(rid, []))
                assert need > num_free
                assert (snap.tables, manager.num_free_blocks) == (tables, num_free)
            before = (snap.tables, snap.tokens, manager.num_free_blocks)
    """,
    'raise NotImplementedError("write prop_slot_mapping': """
        slots = [slot_for(block_table, p, block_size) for p in range(len(block_table) * block_size)]
        for p, slot in enumerate(slots):
            assert divmod(slot, block_size) == (block_table[p // block_size], p % block_size)
        assert len(set(slots)) == len(slots)
    """,
}

SOLUTIONS["13_speculative_decoding"] = {
    'raise NotImplementedError("write verify_greedy': """
        emitted = []
        for i, x in enumerate(draft_token_ids):
            emitted.append(target_argmax[i])
            if x != target_argmax[i]:
                return emitted
        emitted.append(target_argmax[len(draft_token_ids)])
        return emitted
    """,
    'raise NotImplementedError("write verify_random': """
        emitted = []
        for i, x in enumerate(draft_token_ids):
            p = target_probs[i]
            q_x = float(draft_probs[i][x]) if draft_probs is not None else 1.0
            u = float(torch.rand(1, generator=generator))
            if u * q_x < float(p[x]):
                emitted.append(x)
                continue
            if draft_probs is not None:
                residual = (p - draft_probs[i]).clamp(min=0)
            else:
                residual = p.clone()
                residual[x] = 0.0
            if float(residual.sum()) <= 0:
                residual = p
            emitted.append(int(torch.multinomial(residual, 1, generator=generator)))
            return emitted
        bonus = target_probs[len(draft_token_ids)]
        emitted.append(int(torch.multinomial(bonus, 1, generator=generator)))
        return emitted
    """,
}

SOLUTIONS["14_tensor_parallelism"] = {
    'raise NotImplementedError("write column_shard': """
        n = weight.shape[0] // world_size
        return weight[rank * n : (rank + 1) * n]
    """,
    'raise NotImplementedError("write row_shard': """
        n = weight.shape[1] // world_size
        return weight[:, rank * n : (rank + 1) * n]
    """,
    'raise NotImplementedError("write gather_columns': """
        return torch.cat(outputs, dim=1)
    """,
    'raise NotImplementedError("write reduce_rows': """
        total = partials[0].clone()
        for partial in partials[1:]:
            total += partial
        if bias is not None:
            total += bias
        return total
    """,
    'raise NotImplementedError("write heads_of_rank': """
        per_rank = num_heads // world_size
        q_heads = list(range(rank * per_rank, (rank + 1) * per_rank))
        if world_size > num_kv_heads:
            return q_heads, [rank // (world_size // num_kv_heads)]
        kv_per_rank = num_kv_heads // world_size
        return q_heads, list(range(rank * kv_per_rank, (rank + 1) * kv_per_rank))
    """,
}

SOLUTIONS["15_where_the_kv_lives"] = {
    'raise NotImplementedError("write HostBlockTier.lookup': """
        return self.slot_of.get(block_hash)
    """,
    'raise NotImplementedError("write HostBlockTier.touch': """
        self.slot_of.move_to_end(block_hash)
    """,
    'raise NotImplementedError("write HostBlockTier.num_matched': """
        count = 0
        for h in block_hashes:
            if h not in self.slot_of:
                break
            count += 1
        return count
    """,
    'raise NotImplementedError("write HostBlockTier.insert': """
        if self.free_slots:
            slot = self.free_slots.pop()
            self.slot_of[block_hash] = slot
            return slot, None
        for old in self.slot_of:  # least recently used first
            if old not in pinned:
                slot = self.slot_of.pop(old)
                self.slot_of[block_hash] = slot
                return slot, old
        return None
    """,
    'raise NotImplementedError("write HostBlockTier.remove': """
        self.free_slots.append(self.slot_of.pop(block_hash))
    """,
    'raise NotImplementedError("write HostBlockTier.clear': """
        self.slot_of.clear()
        self.free_slots = list(range(self.num_blocks))
    """,
}

SOLUTIONS["16_sliding_window"] = {
    'raise NotImplementedError("write SlidingWindowManager.get_num_skipped_tokens': """
        return max(0, num_computed_tokens - self.sliding_window + 1)
    """,
    'raise NotImplementedError("write SlidingWindowManager.remove_skipped_blocks': """
        blocks = self.req_to_blocks.get(request_id, [])
        num_skipped_blocks = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        freed_any = False
        for i in reversed(range(min(num_skipped_blocks, len(blocks)))):
            if blocks[i] is self.block_pool.null_block:
                break
            self.free_block(request_id, blocks[i])
            blocks[i] = self.block_pool.null_block
            self.num_null_blocks += 1
            freed_any = True
        return freed_any
    """,
    'raise NotImplementedError("write SlidingWindowManager.find_longest_cache_hit': """
        null = self.block_pool.null_block
        window_blocks = (self.sliding_window - 1 + self.block_size - 1) // self.block_size
        # Try the longest hit first; a length is good if its last window_blocks are cached.
        for length in range(max_length // self.block_size, -1, -1):
            start = max(length - window_blocks, 0)
            found = [self.get_cached_block(request, block_hashes, i) for i in range(start, length)]
            if all(block is not None for block in found):
                return [null] * start + found
        return []
    """,
}

SOLUTIONS["17_mixture_of_experts"] = {
    'raise NotImplementedError("write select_experts': """
        probs = torch.softmax(router_logits.to(torch.float32), dim=1)
        weights, ids = probs.topk(top_k, dim=1)
        if renormalize:
            weights = weights / weights.sum(dim=1, keepdim=True)
        return weights, ids
    """,
    'raise NotImplementedError("write sort_by_expert': """
        experts = topk_ids.reshape(-1).long()
        order = sorted(range(len(experts)), key=lambda p: (int(experts[p]), p))
        counts = [0] * num_experts
        for e in experts.tolist():
            counts[e] += 1
        return torch.tensor(order, dtype=torch.int64), torch.tensor(counts, dtype=torch.int64)
    """,
    'raise NotImplementedError("write fused_experts': """
        top_k = topk_ids.shape[1]
        out = torch.zeros_like(hidden_states)
        order, counts = sort_by_expert(topk_ids, w13_weight.shape[0])
        start = 0
        for e, count in enumerate(counts.tolist()):
            pairs = order[start : start + count]
            start += count
            if count:
                tokens = pairs // top_k
                y = expert_mlp(hidden_states[tokens], w13_weight[e], w2_weight[e])
                weight = topk_weights.reshape(-1)[pairs].unsqueeze(1)
                out.index_add_(0, tokens, (y * weight).to(out.dtype))
        return out
    """,
}

SOLUTIONS["18_memory_bound_decode"] = {
    'raise NotImplementedError("write quantize_q8_0': """
        rows, n = x.shape
        if n % 32:
            raise ValueError(f"x has shape {tuple(x.shape)}: rows must be whole blocks of 32")
        blocks = x.reshape(rows, n // 32, 32)
        d = blocks.abs().max(dim=2, keepdim=True).values / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
        v = blocks * inv
        a = v.abs()
        q = torch.sign(v) * (a.floor() + (2 * (a - a.floor())).floor())
        out = torch.empty(rows, n // 32, 34, dtype=torch.uint8)
        out[:, :, :2] = d.half().view(torch.uint8)
        out[:, :, 2:] = q.to(torch.int8).view(torch.uint8)
        return out.reshape(rows, -1)
    """,
    'raise NotImplementedError("write dequantize_q8_0': """
        blocks = raw.reshape(raw.shape[0], -1, 34)
        d = blocks[:, :, :2].contiguous().view(torch.float16).float()
        q = blocks[:, :, 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(raw.shape[0], -1)
    """,
    'raise NotImplementedError("write matmul_q8_0': """
        blocks = raw.reshape(raw.shape[0], -1, 34)
        d = blocks[:, :, :2].contiguous().view(torch.float16).float()[:, :, 0]  # [out, nb]
        q = blocks[:, :, 2:].contiguous().view(torch.int8).float()  # [out, nb, 32]
        y = torch.zeros(x.shape[0], raw.shape[0])
        for b in range(q.shape[1]):
            xb = x[:, 32 * b : 32 * (b + 1)]  # [t, 32]
            y += (xb @ q[:, b, :].T) * d[:, b]
        return y
    """,
}
