"""InputBatch: the step's inputs built from state kept between steps (vLLM's persistent batch).

Consecutive steps look alike. Most requests of a step were in the one before, each a token
further on, and a request's block table changes only every `block_size` tokens, when a block is
appended (or, with speculative decoding, when rejected proposals give their last blocks back).
`step_inputs` (executor/step_inputs.py) is the plain version: it rebuilds every block table from
Python lists, every step. This class keeps one row per request in a block-table array that
lives across steps, and writes into it only the entries that changed; then it computes the
step's positions, slot mapping and lengths for all tokens at once with numpy instead of a Python
loop over tokens.

State and invariant. A request that was in the previous step keeps its row (`row_of`); for
every request with a row, `block_table[row]` holds its block table as the scheduler last sent
it, padded with zeros, and `tables[row]` is that table (the scheduler's tuple). Each step checks
the table the scheduler sends against it: first by identity (the KV cache manager hands out the
same tuple until the request's blocks change, so an unchanged table costs one `is`), then by
value, and rewrites the row only from the first entry that differs. So the row is right after
*any* change (appends, shrinks, a preempted request's new blocks, a new request reusing an id),
not only after appends. Rows of requests that are not in the step go back to `free_rows`; a
request that returns gets a row and its whole table again.

Cost per step, for n requests and t tokens: O(n) Python work (one identity check per request,
a few numpy calls over arrays of n or t entries), plus, per changed table, a comparison and the
entries from its first change on (one per `block_size` decode steps). `step_inputs` loops over
every token in Python and copies every block table entry.

The returned tensors are new each step (numpy results wrapped without a copy), not views of a
buffer the next step rewrites: with tensor parallelism they are pickled to the other ranks, and
pickling a view sends the whole buffer behind it.
"""

from __future__ import annotations

import numpy as np
import torch

from nanovllm.core.scheduler import SchedulerOutput
from nanovllm.executor.kv_cache_groups import with_kv_cache_groups
from nanovllm.executor.step_inputs import step_metadata
from nanovllm.models.attention import AttentionMetadata


class InputBatch:
    """The persistent half of a step's inputs: one block-table row per request."""

    def __init__(self, block_size: int, max_num_seqs: int = 64, max_blocks_per_seq: int = 64):
        self.block_size = block_size
        # [rows, max_blocks_per_seq] int32; grows (rarely) when more rows or columns are needed
        self.block_table = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int32)
        self.tables: list[tuple[int, ...]] = [() for _ in range(max_num_seqs)]  # each row's table
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)  # [rows]: len(tables[row])
        self.row_of: dict[str, int] = {}  # request id -> row
        self.free_rows: list[int] = list(range(max_num_seqs - 1, -1, -1))  # pop() takes row 0

    def prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """The step's flat tensors, equal to `step_inputs`'s (executor/step_inputs.py): input_ids,
        positions, attention metadata and the rows whose logits are sampled."""
        rows = self._sync_rows(out)  # this step's requests' rows, in step order
        num_seqs = len(out.scheduled)
        input_ids: list[int] = []
        logits_rows: list[int] = []
        query_lens = np.empty(num_seqs, dtype=np.int64)
        num_computed = np.empty(num_seqs, dtype=np.int64)
        for i, s in enumerate(out.scheduled):
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            num_spec = len(s.to_verify)  # proposed tokens come after the request's own
            input_ids.extend(s.request.all_token_ids[start : end - num_spec])
            input_ids.extend(s.to_verify)
            query_lens[i] = s.num_new_tokens
            num_computed[i] = start
            if s.samples:  # the request's last own token, then each proposal
                logits_rows.extend(range(len(input_ids) - 1 - num_spec, len(input_ids)))

        seq_lens = num_computed + query_lens  # [num_seqs]: context after the step
        query_start = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start[1:])
        # Each token's sequence, and its position: the sequence's first new position plus its
        # offset among the step's tokens (vLLM's arange trick, no loop over tokens).
        seq_of_token = np.repeat(np.arange(num_seqs), query_lens)  # [num_tokens]
        positions = np.arange(query_start[-1]) + np.repeat(
            num_computed - query_start[:-1], query_lens
        )
        block_rows = rows[seq_of_token]
        logical_blocks = positions // self.block_size  # [num_tokens]
        too_short = logical_blocks >= self.num_blocks[block_rows]
        if too_short.any():  # (the padding would silently send these tokens to block 0)
            token = int(np.argmax(too_short))
            s = out.scheduled[int(seq_of_token[token])]
            raise ValueError(
                f"request {s.request.request_id!r}: position {int(positions[token])} needs block "
                f"{int(logical_blocks[token])} of its block table, which has "
                f"{len(s.block_table)} blocks"
            )
        slot_mapping = (
            self.block_table[block_rows, logical_blocks].astype(np.int64) * self.block_size
            + positions % self.block_size
        )  # [num_tokens]
        max_blocks = int(self.num_blocks[rows].max())
        block_tables = self.block_table[rows, :max_blocks]  # [num_seqs, max_blocks], a copy

        decode_seqs = np.flatnonzero(query_lens == 1)  # sequences with one new token
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slot_mapping),
            block_tables=torch.from_numpy(block_tables),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
            query_start_loc=torch.from_numpy(query_start.astype(np.int32)),
            seq_lens_list=seq_lens.tolist(),
            query_lens_list=query_lens.tolist(),
            query_start_list=query_start.tolist(),
            decode_seq_indices=torch.from_numpy(decode_seqs),
            decode_token_indices=torch.from_numpy(query_start[decode_seqs]),
            prefill_seq_indices=np.flatnonzero(query_lens > 1).tolist(),
        )
        meta = with_kv_cache_groups(meta, out, self.block_size, step_metadata)  # (hybrid)
        input_ids_t = torch.from_numpy(np.array(input_ids, dtype=np.int64))  # [num_tokens]
        return input_ids_t, torch.from_numpy(positions), meta, logits_rows

    # --- the persistent part ------------------------------------------------------------------

    def _sync_rows(self, out: SchedulerOutput) -> np.ndarray:
        """Give every scheduled request a row holding its current block table; free the rows of
        requests that are not in this step. Returns the rows, in step order."""
        scheduled = {s.request.request_id for s in out.scheduled}
        for request_id in [r for r in self.row_of if r not in scheduled]:
            row = self.row_of.pop(request_id)
            self._write_row(row, ())
            self.free_rows.append(row)
        rows = []
        for s in out.scheduled:
            row = self.row_of.get(s.request.request_id)
            if row is None:
                row = self.row_of[s.request.request_id] = self._take_row()
            # (`tuple` of a tuple is the tuple itself: a copy only for a caller's list)
            table, old = tuple(s.block_table), self.tables[row]
            if table is not old and table != old:  # (usually the same: no block appended)
                self._write_row(row, table)
            rows.append(row)
        return np.array(rows, dtype=np.int64)

    def _write_row(self, row: int, table: tuple[int, ...]) -> None:
        """Make `block_table[row]` hold `table` (zero-padded), writing only from the first entry
        that differs from what the row holds now."""
        old = self.tables[row]
        first, common = 0, min(len(old), len(table))
        while first < common and old[first] == table[first]:
            first += 1
        if len(table) > self.block_table.shape[1]:
            self._grow(self.block_table.shape[0], max(len(table), 2 * self.block_table.shape[1]))
        self.block_table[row, first : len(table)] = table[first:]
        if len(old) > len(table):
            self.block_table[row, len(table) : len(old)] = 0
        self.tables[row] = table  # (a tuple: nothing can change it later)
        self.num_blocks[row] = len(table)

    def _take_row(self) -> int:
        if not self.free_rows:
            num_rows = self.block_table.shape[0]
            self._grow(2 * num_rows, self.block_table.shape[1])
            self.free_rows = list(range(2 * num_rows - 1, num_rows - 1, -1))
            self.tables.extend(() for _ in range(num_rows))
            self.num_blocks = np.concatenate([self.num_blocks, np.zeros(num_rows, np.int64)])
        return self.free_rows.pop()

    def _grow(self, num_rows: int, num_cols: int) -> None:
        grown = np.zeros((num_rows, num_cols), dtype=np.int32)
        grown[: self.block_table.shape[0], : self.block_table.shape[1]] = self.block_table
        self.block_table = grown
