"""Structured outputs: every output belongs to its constraint's language, sampled at temperature 1.

Oracles: `jsonschema.validate` (after `json.loads`), `re.fullmatch`, membership in the choice
list, and a matcher of xgrammar's own, built here from the same constraint and fed the output's
tokens (independent of the engine's matcher): every sampled token must be one the grammar
allowed at that point, and the per-step counts in `GrammarMasked` events must equal the
oracle's bitmask popcounts. Unconstrained requests sharing the batch must produce exactly what
they produce alone. The KV cache manager's counters show that a refused constraint leaks no
block.

What is asserted about length: the constraints drawn here have bounded languages (bounded
repeats, strings of at most 3 characters, integers in a range, arrays of at most 2 items, no
free whitespace), and max_tokens is larger than any sentence of them in tokens, so every output
must end with `stop` (the grammar's end, EOS) and validate as a whole. An output cut by
max_tokens (a separate test, free JSON whitespace and a small max_tokens) cannot validate; there
the oracle matcher must accept every token: the output is a prefix of a sentence.

xgrammar's JSON strings admit raw control characters (U+0000-U+001F), which strict JSON
forbids, so outputs are parsed with `json.loads(strict=False)`.
"""

from __future__ import annotations

import json
import re
import sys

import jsonschema
import pytest
import torch
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.events import GrammarMasked, SpecTokensVerified, TokenEmitted
from nanovllm.structured_output.bitmask import unpack_bitmask
from nanovllm.structured_output.manager import StructuredOutputManager

xgr = pytest.importorskip("xgrammar")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}  # fmt: skip
PROMPTS = ["ROMEO:", "JULIET:\nO", "abab abab"]
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def engines(tiny_llama) -> dict[str, LLM]:
    """The same checkpoint three ways: plain, n-gram speculation, and a KV cache so small that
    three requests preempt each other."""
    common = {"attention_backend": "torch", "dtype": "float32", "block_size": 4}
    return {
        "plain": LLM(str(tiny_llama), **common),
        "ngram": LLM(str(tiny_llama), speculative_config=NGRAM, **common),
        "preempt": LLM(str(tiny_llama), num_kv_blocks=40, max_num_batched_tokens=32, **common),
    }


# --- strategies: small constraints with bounded languages ----------------------------------------

SCALARS = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.integers(0, 50).map(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 60}),
    st.integers(0, 3).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.text('abc"\\é', min_size=0, max_size=3), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)
PROPERTY = st.one_of(
    SCALARS,
    st.tuples(SCALARS, st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}
    ),
)
SCHEMAS = st.dictionaries(st.sampled_from("abcdxyz"), PROPERTY, min_size=1, max_size=3).map(
    lambda props: {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
)


def _atom() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from("abcxyz019"),
        st.sampled_from(["[a-c]", "[0-9]", "[xyz]", r"\d", r"\.", "-"]),
    )


PIECE = st.tuples(_atom(), st.sampled_from(["", "?", "{2}", "{1,3}", "{0,2}"])).map("".join)
BRANCH = st.lists(PIECE, min_size=1, max_size=4).map("".join)
REGEXES = st.lists(BRANCH, min_size=1, max_size=3).map(
    lambda branches: branches[0] if len(branches) == 1 else "(" + "|".join(branches) + ")"
)
CHOICES = st.lists(
    st.text("ab \"'\\é{}", min_size=1, max_size=6), min_size=1, max_size=4, unique=True
)
CONSTRAINTS = st.one_of(
    SCHEMAS.map(lambda s: StructuredOutputsParams(json=s, disable_any_whitespace=True)),
    REGEXES.map(lambda r: StructuredOutputsParams(regex=r)),
    CHOICES.map(lambda c: StructuredOutputsParams(choice=c)),
)


def check_text(constraint: StructuredOutputsParams, text: str) -> None:
    """The output is a sentence of the constraint's language (the independent check)."""
    if constraint.json is not None:
        jsonschema.validate(json.loads(text, strict=False), constraint.json)
    elif constraint.regex is not None:
        assert re.fullmatch(constraint.regex, text), (constraint.regex, text)
    elif constraint.choice is not None:
        assert text in constraint.choice, (constraint.choice, text)
    elif constraint.json_object:
        assert isinstance(json.loads(text, strict=False), dict), text


def oracle_matcher(llm: LLM, constraint: StructuredOutputsParams):
    """xgrammar's own matcher for `constraint` over the engine's tokenizer and model vocab,
    compiled here (not taken from the engine)."""
    engine = llm.llm_engine
    vocab = engine.model_args.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(
        engine.tokenizer,
        vocab_size=vocab,
        stop_token_ids=sorted(engine.input_processor.eos_token_ids),
    )
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    if constraint.json is not None:
        compiled = compiler.compile_json_schema(
            constraint.json, any_whitespace=not constraint.disable_any_whitespace
        )
    elif constraint.regex is not None:
        compiled = compiler.compile_regex(constraint.regex)
    elif constraint.choice is not None:
        compiled = compiler.compile_grammar(
            "root ::= " + " | ".join(json.dumps(c) for c in constraint.choice)
        )
    elif constraint.json_object:
        compiled = compiler.compile_json_schema(
            '{"type": "object"}', any_whitespace=not constraint.disable_any_whitespace
        )
    else:
        compiled = compiler.compile_grammar(constraint.grammar)
    return xgr.GrammarMatcher(compiled), vocab


def allowed_counts(llm: LLM, constraint: StructuredOutputsParams, tokens: list[int]) -> list[int]:
    """For each output position, how many tokens the oracle allows there; asserts that each
    token in `tokens` was allowed at its position."""
    matcher, vocab = oracle_matcher(llm, constraint)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    counts = []
    for i, token in enumerate(tokens):
        matcher.fill_next_token_bitmask(bitmask)
        allowed = unpack_bitmask(bitmask, vocab)[0]
        counts.append(int(allowed.sum()))
        assert allowed[token], f"token {token} at position {i} is not allowed by the grammar"
        assert matcher.accept_token(token)
    return counts


def run(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> tuple[list, list]:
    """Generate, recording the engine's events."""
    events = []
    unsubscribe = llm.llm_engine.subscribe(events.append)
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        unsubscribe()
    return outputs, events


def assert_no_leak(llm: LLM) -> None:
    kv = llm.llm_engine.kv_cache_manager
    assert kv.num_used_blocks == 0
    assert kv.num_free_blocks == llm.llm_engine.num_kv_blocks


# --- the property -------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["plain", "ngram", "preempt"])
@settings(max_examples=examples(10), deadline=None)
@given(constraint=CONSTRAINTS, seed=st.integers(0, 2**31), n=st.sampled_from([1, 2]))
def test_every_output_is_a_sentence_of_its_constraint(engines, engine, constraint, seed, n):
    """Sampled at temperature 1, three prompts (n completions each) with the same constraint:
    each output ends by the grammar (`stop`, EOS last) and validates; every token was allowed
    by an independent matcher; with no speculation the masked counts equal the oracle's."""
    llm = engines[engine]
    params = SamplingParams(
        temperature=1.0, max_tokens=MAX_TOKENS, seed=seed, n=n, structured_outputs=constraint
    )
    outputs, events = run(llm, PROMPTS, [params] * len(PROMPTS))
    eos = llm.llm_engine.input_processor.eos_token_ids
    for output in outputs:
        assert len(output.outputs) == n
        for completion in output.outputs:
            assert completion.finish_reason == "stop", completion
            assert completion.token_ids[-1] in eos
            check_text(constraint, completion.text)
            counts = allowed_counts(llm, constraint, completion.token_ids)
            if engine != "ngram":
                rid = output.request_id if n == 1 else f"{completion.index}_{output.request_id}"
                masked = [e.allowed[rid][0] for e in events if isinstance(e, GrammarMasked)
                          and rid in e.allowed]  # fmt: skip
                assert masked == counts
    assert_no_leak(llm)


# --- speculative decoding: the rows filled after tentative accepts, then rolled back --------------


def test_speculative_rows_are_masked_in_order_and_rolled_back(engines):
    """A repetitive regex, so the n-gram proposer proposes (and the grammar refuses some
    proposals): every output still fullmatches, and proposals were verified."""
    llm = engines["ngram"]
    constraint = StructuredOutputsParams(regex="(ab|ba|abc){4,12}x")
    params = [
        SamplingParams(temperature=t, max_tokens=MAX_TOKENS, seed=i, structured_outputs=constraint)
        for i, t in enumerate([0.0, 1.0, 1.0, 1.0])
    ]
    outputs, events = run(llm, ["abab abab", "ababab", "bababa", "abcabc"], params)
    for output in outputs:
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion
        assert re.fullmatch(constraint.regex, completion.text), completion.text
        allowed_counts(llm, constraint, completion.token_ids)
    verified = [e for e in events if isinstance(e, SpecTokensVerified)]
    assert sum(len(e.proposed) for e in verified) > 0
    # Proposals are cut to what the grammar allows: each verified proposal, after the tokens
    # its request had emitted before that step, is accepted by the oracle matcher.
    emitted: dict[str, list[int]] = {}
    for e in events:
        if isinstance(e, TokenEmitted):
            emitted.setdefault(e.request_id, []).append(e.token_id)
        elif isinstance(e, SpecTokensVerified):
            matcher, _ = oracle_matcher(llm, constraint)
            tokens = emitted.get(e.request_id, []) + list(e.proposed)
            assert all(matcher.accept_token(t) for t in tokens), (e, tokens)
    assert_no_leak(llm)


# --- other requests are untouched -----------------------------------------------------------------


def test_unconstrained_requests_in_the_batch_produce_what_they_produce_alone(engines):
    llm = engines["plain"]
    free = [SamplingParams(temperature=0.0, max_tokens=24), SamplingParams(seed=7, max_tokens=24)]
    alone, _ = run(llm, ["ROMEO:", "JULIET:"], free)
    constrained = SamplingParams(
        temperature=1.0, max_tokens=MAX_TOKENS, seed=3,
        structured_outputs=StructuredOutputsParams(regex="[a-c]{3,8}"),
    )  # fmt: skip
    mixed, _ = run(
        llm, ["abab", "ROMEO:", "x", "JULIET:"], [constrained, free[0], constrained, free[1]]
    )
    assert mixed[1].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[3].outputs[0].token_ids == alone[1].outputs[0].token_ids
    for i in (0, 2):
        assert re.fullmatch("[a-c]{3,8}", mixed[i].outputs[0].text)


# --- ends: EOS ignored, max_tokens --------------------------------------------------------------


def test_the_grammar_ends_the_output_even_with_ignore_eos(engines):
    llm = engines["plain"]
    params = SamplingParams(
        temperature=1.0, max_tokens=MAX_TOKENS, seed=1, ignore_eos=True,
        structured_outputs=StructuredOutputsParams(choice=["yes", "no"]),
    )  # fmt: skip
    (output,), _ = run(llm, ["Q:"], [params])
    completion = output.outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.text in ("yes", "no")


@settings(max_examples=examples(6), deadline=None)
@given(seed=st.integers(0, 2**31), max_tokens=st.integers(1, 12))
def test_an_output_cut_by_max_tokens_is_a_prefix_the_grammar_accepts(engines, seed, max_tokens):
    """JSON with free whitespace rarely ends within a few tokens: whatever came out must be
    accepted token by token by the oracle matcher."""
    llm = engines["plain"]
    constraint = StructuredOutputsParams(json_object=True)
    params = SamplingParams(
        temperature=1.0, max_tokens=max_tokens, seed=seed, structured_outputs=constraint
    )
    (output,), _ = run(llm, ["{"], [params])
    completion = output.outputs[0]
    allowed_counts(llm, constraint, completion.token_ids)
    if completion.finish_reason == "stop":
        check_text(constraint, completion.text)
    else:
        assert completion.finish_reason == "length"
        assert len(completion.token_ids) == max_tokens


def test_an_ebnf_grammar(engines):
    llm = engines["plain"]
    grammar = 'root ::= greeting " " name "!"\ngreeting ::= "hi" | "hello"\nname ::= [a-z] [a-z]?'
    params = SamplingParams(
        temperature=1.0, max_tokens=MAX_TOKENS, seed=5, n=3,
        structured_outputs=StructuredOutputsParams(grammar=grammar),
    )  # fmt: skip
    (output,), _ = run(llm, ["Say hi:"], [params])
    for completion in output.outputs:
        assert re.fullmatch(r"(hi|hello) [a-z][a-z]?!", completion.text), completion.text


# --- refusals -------------------------------------------------------------------------------------

BAD = [
    (StructuredOutputsParams(regex="(ab"), "(ab"),
    (StructuredOutputsParams(json={"type": "no such type"}), "no such type"),
    (StructuredOutputsParams(json="{not json"), "{not json"),
    (StructuredOutputsParams(grammar="root ::= undefined_rule"), "undefined_rule"),
    # Grammars xgrammar compiles but that match no finite string: a request could never end.
    (StructuredOutputsParams(grammar="root ::= root"), "matches no finite string"),
    (StructuredOutputsParams(grammar='root ::= "a" root'), "rule 'root' never ends"),
    (StructuredOutputsParams(grammar='root ::= "a" x\nx ::= x "b"'), "nor 'x'"),
]


@pytest.mark.parametrize(("constraint", "named"), BAD)
def test_a_constraint_that_does_not_compile_is_refused_and_others_run_on(
    engines, constraint, named
):
    llm = engines["plain"]
    engine = llm.llm_engine
    engine.add_request("other", "ROMEO:", SamplingParams(temperature=0.0, max_tokens=8))
    engine.step()
    used = engine.kv_cache_manager.num_used_blocks
    with pytest.raises(ValueError, match=re.escape(named)) as caught:
        engine.add_request("bad", "Q:", SamplingParams(structured_outputs=constraint))
    assert "structured_outputs" in str(caught.value)
    assert engine.kv_cache_manager.num_used_blocks == used
    assert "bad" not in engine.scheduler.requests
    final = engine.run_until_done()
    assert final["other"].finished and final["other"].outputs[0].finish_reason == "length"
    assert_no_leak(llm)


@pytest.mark.slow
def test_other_requests_run_while_a_grammar_compiles(engines):
    """The grammar compiles on its own thread (vLLM's design): a plain request added after a
    large constraint finishes its tokens while that constraint is still compiling, and the
    constrained request then runs to one of its choices. (A compile on the engine's thread held
    every step for its whole length, ~0.6 s for these 20,000 choices on a quiet machine.)"""
    engine = engines["plain"].llm_engine
    choices = [str(i) for i in range(20_000, 40_000)]
    constraint = StructuredOutputsParams(json={"enum": choices})
    engine.add_request("big", "x", SamplingParams(max_tokens=12, structured_outputs=constraint))
    engine.add_request("plain", "ROMEO:", SamplingParams(temperature=0.0, max_tokens=4))
    compiled = engine.scheduler.requests["big"].structured_output_request.compiled
    final = {}
    while "plain" not in final:
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert not compiled.done(), "the grammar compiled before the plain request could finish"
    final.update(engine.run_until_done())
    assert final["big"].outputs[0].finish_reason == "stop"
    assert json.loads(final["big"].outputs[0].text) in set(choices)
    assert_no_leak(engines["plain"])


def test_a_grammar_past_a_limit_is_refused_naming_it(engines, monkeypatch):
    engine = engines["plain"].llm_engine
    manager = engine.input_processor.structured_output
    big = StructuredOutputsParams(json={"enum": [str(i) for i in range(50_001)]})
    with pytest.raises(ValueError, match="438909 characters long, more than the limit of 262144"):
        engine.add_request("huge", "x", SamplingParams(structured_outputs=big))
    monkeypatch.setattr(manager, "max_compile_s", 0.0)
    slow = StructuredOutputsParams(json={"enum": [str(i) for i in range(21_000)]})
    engine.add_request("slow", "x", SamplingParams(structured_outputs=slow))
    final = engine.run_until_done()
    assert final["slow"].outputs[0].finish_reason == "error"
    assert "took longer to compile than the limit of 0 s" in final["slow"].error
    assert_no_leak(engines["plain"])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"regex": "a", "choice": ["a"]}, {"choice": []}, {"choice": ["a", ""]}, {"regex": ""},
     {"json": 3}, {"json_object": "yes"}],
)  # fmt: skip
def test_params_take_exactly_one_well_formed_constraint(kwargs):
    with pytest.raises(ValueError, match="structured_outputs"):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_refuses_a_dict_for_structured_outputs():
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})


def test_vllms_import_path():
    from nanovllm.sampling_params import StructuredOutputsParams as Params

    assert Params is StructuredOutputsParams


def test_without_xgrammar_a_structured_request_says_what_to_install(engines, monkeypatch):
    llm = engines["plain"]
    engine = llm.llm_engine
    processor = engine.input_processor
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    fresh = StructuredOutputManager(engine.tokenizer, engine.model_args.vocab_size, frozenset())
    monkeypatch.setattr(processor, "structured_output", fresh)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"))
    with pytest.raises(ValueError, match="pip install xgrammar"):
        engine.add_request("needs-xgrammar", "Q:", params)
    # (an unconstrained request still runs without it)
    engine.add_request("plain", "Q:", SamplingParams(max_tokens=2))
    assert engine.run_until_done()["plain"].finished
    assert_no_leak(llm)


def test_a_compiled_grammar_is_reused(engines):
    llm = engines["plain"]
    manager = llm.llm_engine.input_processor.structured_output
    constraint = StructuredOutputsParams(regex="[xyz]{2}q")
    params = SamplingParams(max_tokens=MAX_TOKENS, n=3, structured_outputs=constraint)
    before = manager.num_compiled
    run(llm, ["a", "b"], [params, params])
    assert manager.num_compiled == before + 1


def test_the_mask_rows_hold_what_the_grammar_allows():
    """`unpack_bitmask` against xgrammar's own reading of a bitmask: its apply function."""
    torch.manual_seed(0)
    vocab = 77
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32)
    logits = torch.zeros(3, vocab)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab)
    assert torch.equal(unpack_bitmask(bitmask, vocab), logits == 0)


def test_the_masked_event_survives_a_round_trip_through_json():
    from nanovllm.events import event_from_dict, event_to_dict

    event = GrammarMasked(3, {"a": (12,), "0_b": (3, 1, 5)}, 320)
    assert event_from_dict(json.loads(json.dumps(event_to_dict(event)))) == event


def test_preempted_structured_requests_resume_their_grammar(engines):
    """Recompute after preemption does not change the output tokens the matcher follows."""
    from nanovllm.events import RequestPreempted

    llm = engines["preempt"]
    constraint = StructuredOutputsParams(regex="[a-z]{30,40}!")
    params = SamplingParams(
        temperature=1.0, max_tokens=MAX_TOKENS, seed=11, n=2, structured_outputs=constraint
    )
    outputs, events = run(llm, ["ROMEO: " * 8, "JULIET: " * 8, "abab " * 8], [params] * 3)
    assert any(isinstance(e, RequestPreempted) for e in events), "the test needs a preemption"
    for output in outputs:
        for completion in output.outputs:
            assert completion.finish_reason == "stop"
            assert re.fullmatch(constraint.regex, completion.text), completion.text
    assert_no_leak(llm)


def test_ids_past_the_tokenizers_vocabulary_are_never_allowed(tmp_path):
    """A model whose vocabulary (and logits) is wider than its tokenizer's, as many are: the
    mask allows no id the tokenizer lacks, so none is sampled, even at a high temperature."""
    from tiny_models import make_model

    path = make_model(tmp_path, vocab_size=512, init_range=0.02)
    llm = LLM(str(path), attention_backend="torch", dtype="float32", block_size=4)
    num_tokenizer_ids = len(llm.get_tokenizer())
    assert num_tokenizer_ids < 512
    constraint = StructuredOutputsParams(regex="[a-z]{5,20}")
    params = SamplingParams(
        temperature=2.0, max_tokens=MAX_TOKENS, seed=4, n=4, structured_outputs=constraint
    )
    outputs, events = run(llm, ["x"], [params])
    masked = [e for e in events if isinstance(e, GrammarMasked)]
    assert masked and all(e.vocab_size == 512 for e in masked)
    for completion in outputs[0].outputs:
        assert all(t < num_tokenizer_ids for t in completion.token_ids)
        assert re.fullmatch(constraint.regex, completion.text)
    # The mask itself: no bit past the tokenizer's ids is ever set.
    manager = llm.llm_engine.input_processor.structured_output
    grammar = manager.grammar_init(SamplingParams(structured_outputs=constraint)).grammar
    bitmask = torch.zeros(1, 16, dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    assert not unpack_bitmask(bitmask, 512)[0, num_tokenizer_ids:].any()
