"""Lesson 03 properties: the queue behaves like a list in LRU order, rejects misuse, never scans.

The model is a plain Python list of block ids, head first. Scripts of operations are drawn by
hypothesis as (operation, k) pairs; k picks *which* block to append or remove among those that
make the operation valid at that moment, so every drawn script is a legal use of the queue.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from nanovllm.core.free_block_queue import KVCacheBlock
from nanovllm.lessons.testing import expect_raises, lesson_settings, show_inputs, walk_free_list

scripts = st.lists(
    st.tuples(st.sampled_from(["popleft", "append", "remove"]), st.integers(0, 1000)),
    max_size=40,
)


def _new_queue(impl, blocks: list[KVCacheBlock]) -> tuple[object, Callable[[], list[KVCacheBlock]]]:
    """A queue over `blocks`, and a function giving the blocks in it, head first.

    The blocks come from a walk of the list from the sentinels the constructor linked the first
    and last block to, which stops at a cycle or past `len(blocks)` blocks (`walk_free_list`):
    a broken list fails the property instead of hanging it. With no blocks there is nothing to
    link and nothing that can loop: they are the queue's own `get_all_free_blocks`.
    """
    queue = impl.FreeBlockQueue(blocks)
    if not blocks:
        return queue, queue.get_all_free_blocks
    head, tail = blocks[0].prev_free, blocks[-1].next_free
    assert head is not None and tail is not None, (
        "a new queue links its first block to the head sentinel and its last to the tail"
    )
    return queue, lambda: walk_free_list(head, tail, len(blocks))


def _ids(free: Callable[[], list[KVCacheBlock]]) -> list[int]:
    return [b.block_id for b in free()]


def _replay(
    impl, num_blocks: int, script
) -> tuple[object, list[int], list[KVCacheBlock], Callable[[], list[KVCacheBlock]]]:
    """Run `script` on a fresh queue and on the list model, comparing after every operation.

    Returns the queue, the model (ids in the queue, head first), the blocks taken out and the
    function giving the blocks in the queue (see `_new_queue`).
    """
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    queue, free = _new_queue(impl, blocks)
    model = list(range(num_blocks))
    taken: list[KVCacheBlock] = []
    assert _ids(free) == model, "the queue must start with the blocks in the order given"
    listed = [b.block_id for b in queue.get_all_free_blocks()]
    assert listed == model, f"a new queue's get_all_free_blocks() gives {listed}, expected {model}"
    for op, k in script:
        if op == "popleft":
            if not model:
                continue  # popping an empty queue is tested on its own
            block = queue.popleft()
            assert block.block_id == model[0], (
                f"popleft returned block {block.block_id}; the least recently freed is {model[0]}"
            )
            model.pop(0)
            taken.append(block)
        elif op == "append":
            if not taken:
                continue
            block = taken.pop(k % len(taken))
            queue.append(block)
            model.append(block.block_id)
        else:  # remove a block from anywhere in the queue
            if not model:
                continue
            block = blocks[model[k % len(model)]]
            queue.remove(block)
            model.remove(block.block_id)
            taken.append(block)
        ids = _ids(free)
        assert ids == model, f"after {op}: queue {ids}, expected {model}"
        assert queue.num_free_blocks == len(model), "num_free_blocks is out of date"
        listed = [b.block_id for b in queue.get_all_free_blocks()]
        assert listed == model, (
            f"after {op}: get_all_free_blocks() gives {listed}, expected {model}"
        )
    return queue, model, taken, free


@lesson_settings(40)
@given(num_blocks=st.integers(0, 8), script=scripts)
@show_inputs
def test_behaves_like_a_list_in_lru_order(impl, num_blocks, script):
    """After every popleft, append and remove the queue holds what a plain list would, in LRU
    order."""
    _replay(impl, num_blocks, script)


@lesson_settings(30)
@given(num_blocks=st.integers(0, 6), script=scripts)
@show_inputs
def test_popleft_on_an_empty_queue_raises(impl, num_blocks, script):
    """popleft on an empty queue raises ValueError and leaves the queue empty."""
    queue, model, _, free = _replay(impl, num_blocks, script)
    for _ in model:
        queue.popleft()
    with expect_raises(ValueError, "popleft on an empty queue"):
        queue.popleft()
    assert _ids(free) == [] and queue.num_free_blocks == 0


@lesson_settings(40)
@given(num_blocks=st.integers(1, 8), script=scripts, k=st.integers(0, 100))
@show_inputs
def test_misuse_raises_and_changes_nothing(impl, num_blocks, script, k):
    """Appending a free block (a double free) or removing a taken one raises ValueError and
    changes nothing."""
    queue, model, taken, free = _replay(impl, num_blocks, script)
    if model:  # appending a block that is already free: a double free
        in_queue = free()[k % len(model)]
        with expect_raises(ValueError, f"append(block {in_queue.block_id}), already free,"):
            queue.append(in_queue)
        assert _ids(free) == model and queue.num_free_blocks == len(model)
    if taken:  # removing a block that is not free
        block = taken[k % len(taken)]
        with expect_raises(ValueError, f"remove(block {block.block_id}), not free,"):
            queue.remove(block)
        assert _ids(free) == model and queue.num_free_blocks == len(model)


class CountingBlock(KVCacheBlock):
    """A block that counts how often its links are read (a scan reads hundreds)."""

    __slots__ = ("_prev", "_next")
    reads = 0

    @property
    def prev_free(self):
        CountingBlock.reads += 1
        return self._prev

    @prev_free.setter
    def prev_free(self, value):
        self._prev = value

    @property
    def next_free(self):
        CountingBlock.reads += 1
        return self._next

    @next_free.setter
    def next_free(self, value):
        self._next = value


@lesson_settings(15)
@given(position=st.integers(100, 299))
@show_inputs
def test_no_operation_walks_the_list(impl, position):
    """Each operation reads a handful of links, however long the queue (300 blocks here)."""
    blocks = [CountingBlock(i) for i in range(300)]
    queue = impl.FreeBlockQueue(blocks)
    budget = 12
    popped: list[KVCacheBlock] = []
    for name, op in [
        ("remove", lambda: queue.remove(blocks[position])),
        ("append", lambda: queue.append(blocks[position])),
        ("popleft", lambda: popped.append(queue.popleft())),
        ("append", lambda: queue.append(popped[0])),
    ]:
        CountingBlock.reads = 0
        op()
        assert CountingBlock.reads <= budget, (
            f"{name} read {CountingBlock.reads} links in a queue of 300: it walks the list"
        )
