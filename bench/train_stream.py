"""Streamed training throughput against its two parts, and its memory against the token count.

In ONE process, on the demo's model and SAEs (SmolLM2-135M, TopK 4608 latents, k=32, at
blocks 8/15/22 hook_resid_post, batches of 4096 tokens):
- forward: the bare forward stopped after layer 22, capturing the three hooks (tokens/s);
- train: the cached trainer training the three SAEs together from a cache of the same
  tokens (tokens/s of its loop, from training.json);
- stream: `train --from-model` training the same three SAEs (tokens/s of its loop, which
  includes every forward);
- the bound 1 / (1/forward + 1/train), what a stream that overlaps nothing can reach, and
  stream / bound.
Then peak RSS of streamed training at two token counts, each in a fresh process.

    PYTHONPATH=. python bench/train_stream.py [--tokens 65536 --rss-tokens 32768 131072]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import load_model
from sae_atlas.saes.train.atlas import train_saes
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.from_model import StreamOptions, train_from_model

HOOKS = [f"blocks.{layer}.hook_resid_post" for layer in (8, 15, 22)]
SAE = {"d_sae": 4608, "k": 32}
CORPUS = CorpusSpec(context_size=128)


def _train_cfg(tokens: int) -> TrainConfig:
    return TrainConfig(total_tokens=tokens, batch_size=4096, progress=False)


def _loop_tokens_per_second(root: Path, tokens: int) -> float:
    """Tokens per second of the training loop (the slowest of the three SAEs' records)."""
    walls = [json.loads((root / "saes" / f"{hook}-topk-4608" / "training.json").read_text())
             ["final_metrics"]["wall_seconds"] for hook in HOOKS]
    return tokens // 4096 * 4096 / max(walls)


def forward_tokens_per_second(handle, tokens: int, batch_blocks: int) -> float:
    """The bare stopped forward over `tokens` corpus tokens, all three hooks captured."""
    batches = list(iter_blocks(handle.tokenizer, CORPUS, max_blocks=tokens // CORPUS.context_size,
                               batch_blocks=batch_blocks))
    started = time.perf_counter()
    for batch in batches:
        run_hooks(handle, batch.token_ids, HOOKS)
    return sum(b.token_ids.numel() for b in batches) / (time.perf_counter() - started)


def streamed(root: Path, tokens: int, batch_blocks: int, buffer_tokens: int) -> float:
    """Train the three SAEs from the stream; the loop's tokens/s."""
    handle = load_model("smollm2-135m", device="cpu", dtype="float32")
    stream = StreamOptions(CORPUS, batch_blocks=batch_blocks, buffer_tokens=buffer_tokens, heldout_tokens=4096)
    train_from_model(handle, root, HOOKS, train_cfg=_train_cfg(tokens), stream=stream, **SAE)
    return _loop_tokens_per_second(root, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--rss-tokens", type=int, nargs=2, default=[32768, 131072])
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--buffer-tokens", type=int, default=65536)
    parser.add_argument("--rss-only", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.rss_only:
        with tempfile.TemporaryDirectory() as tmp:
            streamed(Path(tmp) / "atlas", args.rss_only, args.batch_blocks, args.buffer_tokens)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)  # MiB
        return
    handle = load_model("smollm2-135m", device="cpu", dtype="float32")
    forward = forward_tokens_per_second(handle, args.tokens, args.batch_blocks)
    with tempfile.TemporaryDirectory() as tmp:
        cached = Path(tmp) / "cached"
        cache_activations(handle, cached, HOOKS, corpus=CORPUS, n_tokens=args.tokens * 10 // 9 + 4 * 4096,
                          batch_blocks=args.batch_blocks, progress=False)
        train_saes(cached, HOOKS, train_cfg=_train_cfg(args.tokens), **SAE)
        train = _loop_tokens_per_second(cached, args.tokens)
        stream = streamed(Path(tmp) / "stream", args.tokens, args.batch_blocks, args.buffer_tokens)
    bound = 1 / (1 / forward + 1 / train)
    print(f"tokens {args.tokens}, threads {torch.get_num_threads()}")
    print(f"forward (stopped after layer 22, 3 hooks): {forward:,.0f} tok/s")
    print(f"cached trainer (3 SAEs, one loop):          {train:,.0f} tok/s")
    print(f"streamed training (3 SAEs):                {stream:,.0f} tok/s")
    print(f"bound 1/(1/forward + 1/train):             {bound:,.0f} tok/s; stream / bound = {stream / bound:.2f}")
    for tokens in args.rss_tokens:
        out = subprocess.run([sys.executable, __file__, "--rss-only", str(tokens), "--batch-blocks",
                              str(args.batch_blocks), "--buffer-tokens", str(args.buffer_tokens)],
                             capture_output=True, text=True, check=True)
        print(f"peak RSS of streamed training at {tokens:,} tokens: {out.stdout.split()[-1]} MiB")


if __name__ == "__main__":
    main()
