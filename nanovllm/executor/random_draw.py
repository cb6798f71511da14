"""Drawing one token per row, with each request's own generator: the two ways vLLM does it.

The sampler hands over rows of logits that are already divided by the temperature and filtered
(masked tokens are -inf), and one `torch.Generator` per row, seeded with the request's seed. Both
draws pick token i with probability softmax(logits)_i, and both use the generator so that a
seeded request draws the same tokens whatever shares its batch. They differ in how the noise is
made, so the same seed gives different tokens in each: vLLM's GPU build uses the first, its CPU
build the second. nanovllm uses the one vLLM uses on the same device (`draw_for`), so a seeded
request gives vLLM's tokens there.

Generators live where sampling happens (`generator_for`). Each random request's generator is
created on the device of the logits, seeded with the request's seed: a CPU generator cannot
drive random ops on CUDA tensors. It advances only when *that* request samples, so the noise a
seeded request draws does not depend on what else shares the batch. Its logits can: a matmul
over a different batch shape rounds differently (here about 4e-6 apart), so a draw that lands
that close to the boundary between two tokens can pick the other one. Same seed and same batch,
same tokens.

- `exponential_race` (vLLM: `vllm/v1/sample/ops/topk_topp_sampler.py`, `random_sample`): draw
  q_i ~ Exp(1) for every token and take argmax_i p_i / q_i. Token i wins with probability
  exactly p_i: the smallest of independent exponentials with rates p_i is the i-th with
  probability p_i / sum p. The generator advances by one draw per token of the vocabulary.
- `hashed_gumbel_max` (vLLM: `TopKTopPSampler.forward_cpu`, which calls the C++ op
  `fused_gumbel_argmax`): the generator gives the row one 31-bit seed per step
  (`torch.randint(0, 2**31, (1,))`); token i's noise is a hash of (seed, i), SplitMix64, turned
  into a uniform u_i in (0, 1) and then into Gumbel noise g_i = -log(-log u_i); the token is
  argmax_i (logit_i + g_i), in float64. The Gumbel-max trick: the argmax of logits plus
  independent Gumbel noise is distributed as softmax(logits). Hashing instead of drawing one
  number per token lets a kernel compute any token's noise on its own; here it is plain torch
  int64 arithmetic (a uint64 multiply wraps the same in int64, and `>>` on int64 is made logical
  by a mask).

Cost (measured on the 2-core CPU, fp32 logits, one thread): 64 rows of a 49,152-token vocabulary
take about 80 ms with the race and 180 ms with the hashed Gumbel-max; 64 rows of 512 tokens, 5
and 0.6 ms.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nanovllm.request import Request

# A draw: (filtered logits [n, vocab], their softmax [n, vocab], one generator per row) -> n tokens.
Draw = Callable[[torch.Tensor, torch.Tensor, list[torch.Generator]], list[int]]


def generator_for(request: Request, device: torch.device) -> torch.Generator:
    """The request's own generator, on `device` (made on first use from `request.seed`)."""
    generator = request.generator
    if generator is None or generator.device != device:
        assert request.seed is not None, "a random request always has a seed (the engine's)"
        generator = torch.Generator(device=device).manual_seed(request.seed)
        request.generator = generator
    return generator


def exponential_race(
    logits: torch.Tensor, probs: torch.Tensor, generators: list[torch.Generator]
) -> list[int]:
    """argmax_i p_i / q_i with q_i ~ Exp(1), each row's noise from its own generator."""
    noise = torch.empty_like(probs)  # [n, vocab]
    for row, generator in enumerate(generators):
        noise[row].exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # an exact 0 would make 0 / 0
    return (probs / noise).argmax(dim=-1).tolist()


def _u64(x: int) -> int:
    """A uint64 constant as the int64 with the same bits (what torch stores)."""
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN_GAMMA = _u64(0x9E3779B97F4A7C15)  # SplitMix64's step between consecutive inputs
MIX_1 = _u64(0xBF58476D1CE4E5B9)
MIX_2 = _u64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 tensors that hold uint64 bits (`>>` alone keeps the sign)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijective mix of 64 bits, elementwise (int64 holding uint64)."""
    z = (z ^ _shift_right(z, 30)) * MIX_1
    z = (z ^ _shift_right(z, 27)) * MIX_2
    return z ^ _shift_right(z, 31)


def gumbel_noise(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """g[r, i] = -log(-log u) with u from SplitMix64(SplitMix64(seeds[r]) + (i + 1) * gamma):
    [n] int64 seeds -> [n, vocab_size] float64 noise."""
    key = splitmix64(seeds.to(torch.int64))[:, None]  # [n, 1]
    i = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seeds.device)  # [vocab]
    bits = _shift_right(splitmix64(key + i * GOLDEN_GAMMA), 11)  # [n, vocab], 53 random bits
    u = (bits.double() + 0.5) * 2.0**-53  # in (0, 1): never exactly 0 or 1
    return -torch.log(-torch.log(u))


def hashed_gumbel_max(
    logits: torch.Tensor, probs: torch.Tensor, generators: list[torch.Generator]
) -> list[int]:
    """argmax_i (logit_i + g_i), g from a per-step seed each row's generator gives."""
    seeds = torch.cat([torch.randint(0, 2**31, (1,), generator=g) for g in generators])  # [n]
    noisy = logits.double() + gumbel_noise(seeds, logits.shape[-1])  # [n, vocab]; -inf stays
    return noisy.argmax(dim=-1).tolist()


def draw_for(device: torch.device) -> Draw:
    """The draw vLLM uses on this kind of device: hashed Gumbel-max on a CPU, else the race."""
    return hashed_gumbel_max if device.type == "cpu" else exponential_race
