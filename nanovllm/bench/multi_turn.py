"""The multi-turn chat workload: conversations whose every turn resends the conversation so far.

N conversations of T turns. Turn t of conversation c asks for `answer_lens[c][t]` tokens, with
the prompt

    prompt(c, 0) = user(c, 0)
    prompt(c, t) = prompt(c, t - 1) + answer(c, t - 1) + user(c, t)

where answer(c, t - 1) is what the engine generated for the turn before. A turn can only be sent
once the previous one is answered, so the prompts are built while the workload is served
(`drive_conversations`), as a chat client builds them. Every turn's prompt starts with the whole
previous turn, prompt and answer, so a prefix cache (and a KV tier under it) can serve all of it
but the new user message.

The turns are sent in round-robin order (turn 0 of every conversation, then turn 1 of every
one, ...), at most `concurrency` at a time: between two turns of one conversation, each of the
others takes its turn. When the conversations together need more KV blocks than the device pool
holds, a conversation's blocks have been handed to the others (evicted) by the time it comes
back, unless a tier below the pool kept them.

User messages are token ids drawn uniformly from the model's vocabulary (ids below 3 avoided,
as in workload.py); their lengths and the answers' lengths are uniform in their ranges, each
from its own seeded generator, drawn conversation by conversation: the same seed gives the same
conversations whatever the model, and conversation c does not depend on how many follow it.
Every answer is exactly its length (EOS is ignored). `drive_conversations` uses only the
standard library and never the clock to decide what to send, so the same engine and seed send
the same prompts in the same order on every run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from nanovllm.bench.workload import _ids, _rng

# Streams of their own (workload.py's are 0-5): user lengths, answer lengths, user token ids.
_USER_LENGTHS, _ANSWER_LENGTHS, _USER_TOKENS = 6, 7, 8


@dataclass(frozen=True)
class MultiTurnWorkload:
    user_messages: list[list[list[int]]]  # [conversation][turn] -> the user's new token ids
    answer_lens: list[list[int]]  # [conversation][turn] -> output tokens asked for
    concurrency: int  # turns in flight at most
    description: str

    @property
    def num_conversations(self) -> int:
        return len(self.user_messages)

    @property
    def num_turns(self) -> int:
        return len(self.user_messages[0])

    @property
    def num_requests(self) -> int:
        return self.num_conversations * self.num_turns

    @property
    def num_output_tokens(self) -> int:
        return sum(map(sum, self.answer_lens))

    @property
    def num_prompt_tokens(self) -> int:
        """Every turn's prompt: the user messages so far and the answers before it."""
        total = 0
        for msgs, lens in zip(self.user_messages, self.answer_lens):
            sent = 0  # the conversation so far
            for user, answer in zip(msgs, lens):
                sent += len(user)
                total += sent
                sent += answer
        return total

    def reusable_tokens(self, block_size: int) -> int:
        """Prompt tokens a prefix cache that lost nothing would serve: for each turn after the
        first, the full blocks of the previous turn's prompt and answer without its last token
        (sampled last, that token's KV is never computed)."""
        total = 0
        for msgs, lens in zip(self.user_messages, self.answer_lens):
            sent = 0
            for t, (user, answer) in enumerate(zip(msgs, lens)):
                if t:
                    total += (sent - 1) // block_size * block_size
                sent += len(user) + answer
        return total

    @property
    def max_seq_len(self) -> int:
        """The longest sequence: a conversation's last turn, its answer included."""
        return max(
            sum(map(len, msgs)) + sum(lens)
            for msgs, lens in zip(self.user_messages, self.answer_lens)
        )

    def index(self, conversation: int, turn: int) -> int:
        """Request index of a turn: conversation-major (c * T + t)."""
        return conversation * self.num_turns + turn

    def order(self) -> list[tuple[int, int]]:
        """(conversation, turn) in the order they are sent: round-robin, turn by turn."""
        return [(c, t) for t in range(self.num_turns) for c in range(self.num_conversations)]

    def head(self, num_conversations: int, num_turns: int, answer_len: int) -> MultiTurnWorkload:
        """The first conversations and turns, answers cut to `answer_len` (warm-ups)."""
        msgs = [conv[:num_turns] for conv in self.user_messages[:num_conversations]]
        lens = [
            [min(n, answer_len) for n in conv[:num_turns]]
            for conv in self.answer_lens[:num_conversations]
        ]
        return replace(
            self,
            user_messages=msgs,
            answer_lens=lens,
            description=f"first {num_conversations} x {num_turns} of: {self.description}",
        )


def multi_turn_workload(
    num_conversations: int,
    num_turns: int,
    user_len: tuple[int, int],
    answer_len: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
    concurrency: int = 2,
) -> MultiTurnWorkload:
    """N conversations of T turns, user messages and answers uniform in their (inclusive)
    length ranges; `concurrency` turns in flight at most."""
    for name, value in (
        ("num_conversations", num_conversations),
        ("num_turns", num_turns),
        ("concurrency", concurrency),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    users, answers = _rng(seed, _USER_LENGTHS), _rng(seed, _ANSWER_LENGTHS)
    ids = _rng(seed, _USER_TOKENS)
    msgs, lens = [], []
    for _ in range(num_conversations):
        msgs.append([_ids(ids, users.randint(*user_len), vocab_size) for _ in range(num_turns)])
        lens.append([answers.randint(*answer_len) for _ in range(num_turns)])
    description = (
        f"{num_conversations} conversations x {num_turns} turns, user messages "
        f"{user_len[0]}-{user_len[1]}, answers {answer_len[0]}-{answer_len[1]} tokens, "
        f"{concurrency} in flight, round-robin"
    )
    return MultiTurnWorkload(msgs, lens, concurrency, description)


@dataclass
class ConversationsServed:
    """What `drive_conversations` saw, per request (index `workload.index(c, t)`)."""

    wall_s: float
    prompts: list[list[int]]
    tokens: list[list[int]]
    times: list[list[float]]  # seconds since the start, one per token
    sent: list[float]  # when each request was added, seconds since the start


def drive_conversations(
    workload: MultiTurnWorkload,
    add: Callable[[int, list[int], int], None],
    step: Callable[[], Iterable[tuple[int, list[int]]]],
    on_tokens: Callable[[int], None] | None = None,
) -> ConversationsServed:
    """Serve the conversations: `add(i, prompt_token_ids, max_tokens)` submits request i,
    `step()` does one engine step and returns (request index, new token ids) pairs.

    Turns are added in `workload.order()`, each once fewer than `concurrency` are in flight
    and its conversation's previous turn is answered (a turn is answered when it has its
    `max_tokens` tokens)."""
    n = workload.num_requests
    prompts: list[list[int]] = [[] for _ in range(n)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    times: list[list[float]] = [[] for _ in range(n)]
    sent = [0.0] * n
    wanted = [length for lens in workload.answer_lens for length in lens]
    answered = [False] * n
    order, nxt, in_flight = workload.order(), 0, 0
    start = time.perf_counter()
    while nxt < n or in_flight:
        while nxt < n and in_flight < workload.concurrency:
            c, t = order[nxt]
            i = workload.index(c, t)
            if t and not answered[i - 1]:
                break  # the previous turn (in flight: sent earlier) is not answered yet
            user = workload.user_messages[c][t]
            prompts[i] = prompts[i - 1] + tokens[i - 1] + user if t else list(user)
            sent[i] = time.perf_counter() - start
            add(i, prompts[i], wanted[i])
            nxt, in_flight = nxt + 1, in_flight + 1
        produced = list(step())
        now = time.perf_counter() - start
        for i, new in produced:
            new = new[: wanted[i] - len(tokens[i])]
            tokens[i].extend(new)
            times[i].extend([now] * len(new))
            if not answered[i] and len(tokens[i]) == wanted[i]:
                answered[i], in_flight = True, in_flight - 1
        if on_tokens is not None:
            on_tokens(sum(len(new) for _, new in produced))
    return ConversationsServed(time.perf_counter() - start, prompts, tokens, times, sent)
