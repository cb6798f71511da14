"""Shared builders for the mixture-of-experts kernel tests: random routings and a dense oracle.

A case is a small, printable `MoeSpec` (what hypothesis draws and shrinks), built into tensors by
`build_moe` deterministically from its seed. The routings it draws are the ones a kernel that
groups tokens by expert can get wrong:

- "random": each token picks k distinct experts;
- "subset": only some experts are ever picked (the others get no token, hence no block);
- "same": every token picks the same k experts (one expert's run spans several blocks);
- "repeat": a token may list one expert more than once (it counts once per listing).

(Named `moe_testing`: test folders have no `__init__.py`, so module names must be unique.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

# (atol, rtol) per dtype against the float32 reference. The kernel rounds its two intermediate
# activations to the input dtype, as vLLM's does; the reference rounds only its output.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (5e-2, 5e-2),
}

ROUTINGS = ("random", "subset", "same", "repeat")


@dataclass(frozen=True)
class MoeSpec:
    num_tokens: int
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    routing: str  # one of ROUTINGS
    dtype: torch.dtype = torch.float32
    ids_dtype: torch.dtype = torch.int64
    seed: int = 0


@dataclass
class MoeCase:
    hidden_states: torch.Tensor  # [num_tokens, hidden]
    w13: torch.Tensor  # [num_experts, 2 * intermediate, hidden]
    w2: torch.Tensor  # [num_experts, hidden, intermediate]
    topk_weights: torch.Tensor  # [num_tokens, k] float32
    topk_ids: torch.Tensor  # [num_tokens, k]

    def args(self) -> tuple:
        return self.hidden_states, self.w13, self.w2, self.topk_weights, self.topk_ids


def route(spec: MoeSpec, g: torch.Generator) -> torch.Tensor:
    """[num_tokens, k] expert ids drawn by the spec's routing rule."""
    n, e, k = spec.num_tokens, spec.num_experts, spec.top_k
    if spec.routing == "repeat":
        return torch.randint(0, e, (n, k), generator=g)
    if spec.routing == "same":
        return torch.randperm(e, generator=g)[:k].expand(n, k).clone()
    pool = torch.randperm(e, generator=g)
    if spec.routing == "subset":  # the first max(k, e // 2) of a shuffle; the rest get nothing
        pool = pool[: max(k, e // 2)]
    picks = [pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(n)]
    return torch.stack(picks) if picks else torch.empty(0, k, dtype=torch.long)


def build_moe(spec: MoeSpec) -> MoeCase:
    g = torch.Generator().manual_seed(spec.seed)
    e, h, i = spec.num_experts, spec.hidden, spec.intermediate
    # Weights scaled so activations stay near 1 (half precision keeps its relative accuracy).
    w13 = torch.randn(e, 2 * i, h, generator=g) * h**-0.5
    w2 = torch.randn(e, h, i, generator=g) * i**-0.5
    x = torch.randn(spec.num_tokens, h, generator=g)
    weights = torch.rand(spec.num_tokens, spec.top_k, generator=g)
    return MoeCase(
        hidden_states=x.to(spec.dtype),
        w13=w13.to(spec.dtype),
        w2=w2.to(spec.dtype),
        topk_weights=weights,
        topk_ids=route(spec, g).to(spec.ids_dtype),
    )


@st.composite
def moe_specs(
    draw,
    max_tokens: int = 40,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    hiddens: tuple[int, ...] = (16, 24, 32),
    intermediates: tuple[int, ...] = (16, 20, 32),
) -> MoeSpec:
    """Token counts 0, 1, and up to past two 16-row blocks; 1-5 experts; k up to 3."""
    num_experts = draw(st.integers(1, 5))
    return MoeSpec(
        num_tokens=draw(st.one_of(st.sampled_from((0, 1, 16, 17)), st.integers(0, max_tokens))),
        num_experts=num_experts,
        top_k=draw(st.integers(1, min(3, num_experts))),
        hidden=draw(st.sampled_from(hiddens)),
        intermediate=draw(st.sampled_from(intermediates)),
        routing=draw(st.sampled_from(ROUTINGS)),
        dtype=draw(st.sampled_from(dtypes)),
        ids_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
        seed=draw(st.integers(0, 2**16)),
    )


def dense_moe(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The dense oracle: every expert on every token, combined with one-hot routing weights.

    No indexing by routed token: the routing enters only as a [num_tokens, num_experts] weight
    matrix (zero where a token did not choose an expert), in float64.
    """
    num_experts, two_i, _ = w13.shape
    i = two_i // 2
    x, w13, w2 = hidden_states.double(), w13.double(), w2.double()
    gate_up = torch.einsum("erh,th->etr", w13, x)  # [E, T, 2I]
    act = F.silu(gate_up[..., :i]) * gate_up[..., i:]  # [E, T, I]
    y = torch.einsum("ehi,eti->eth", w2, act)  # [E, T, H]
    one_hot = F.one_hot(topk_ids.long(), num_experts).double()  # [T, k, E]
    dense_weights = (one_hot * topk_weights.double()[..., None]).sum(1)  # [T, E]
    return torch.einsum("te,eth->th", dense_weights, y)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCES[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
