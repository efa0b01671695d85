"""Cost of the depth analysis against a bare full forward, in one run.

Baseline: the model's plain forward (no hooks) over the same corpus blocks. Measured: the
depth stream (`saes.depth.stream.stream_depth`: every layer's residual captured, the token
subsample kept, CKA sums, tuned-lens fit and lens scores) and, separately, the estimators on
its subsample (`api.analyses.depth.depth_tables`: TwoNN, MLE with bootstrap, local ID,
trajectories, CKA result). Prints tokens/s of each and their ratios to the baseline.

    nice -n 10 .venv/bin/python bench/depth_cost.py --model smollm2-135m --tokens 16384 --device cuda
    nice -n 10 .venv/bin/python bench/depth_cost.py --model '{"kind": "tiny", "n_layers": 6}' --tokens 4096
"""

from __future__ import annotations

import argparse
import time

import torch

from sae_atlas.api.analyses.depth import depth_tables
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.depth.stream import stream_depth
from sae_atlas.saes.models import load_model, normalize_spec
from sae_atlas.saes.streaming import whole_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--max-points", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    handle = load_model(normalize_spec(args.model), device=args.device)
    corpus = CorpusSpec(context_size=args.context)
    n_blocks = whole_blocks(args.tokens, corpus)
    tokens = n_blocks * args.context

    start = time.perf_counter()
    with torch.inference_mode():
        for batch in iter_blocks(handle.tokenizer, corpus, max_blocks=n_blocks, batch_blocks=args.batch_blocks):
            handle.bridge(batch.token_ids.to(handle.device))
    bare = time.perf_counter() - start

    start = time.perf_counter()
    stream = stream_depth(handle, corpus, list(range(handle.n_layers)), n_tokens=args.tokens,
                          batch_blocks=args.batch_blocks, max_points=args.max_points, progress=False)
    streamed = time.perf_counter() - start
    start = time.perf_counter()
    depth_tables(stream, k=20, mle_k=10, n_boot=200, seed=0, space="raw")
    estimators = time.perf_counter() - start

    print(f"model {handle.name}, {handle.n_layers} layers, {tokens} tokens, device {args.device}, "
          f"{args.threads} threads, subsample {len(stream.states)}")
    for name, seconds in (("bare forward", bare), ("depth stream", streamed), ("estimators", estimators),
                          ("depth total", streamed + estimators)):
        print(f"{name:>14}: {seconds:7.2f} s  {tokens / seconds:9.0f} tok/s  ratio to bare {bare / seconds:5.2f}x")


if __name__ == "__main__":
    main()
