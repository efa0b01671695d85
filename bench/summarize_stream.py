"""Streamed summaries (`summarize --from-model`) against a bare forward, and their peak memory.

    python bench/summarize_stream.py [--tokens 20000 200000] [--model tiny|smollm2-135m]
                                     [--d-sae 2048] [--k 32] [--batch-blocks 8]

For each token count a fresh child process builds an atlas with two random TopK SAEs on
two hooks (the deepest in the middle of the model), then, over the same corpus blocks,
times (a) the bare forward of `saes.cache.run_hooks` to the deepest hooked layer (before
and after (b); the faster of the two is the baseline, to damp load from other processes) and
(b) `summarize_from_model` (the same forward plus both SAEs' accumulators, occurrence
spool, checkpoints and the written tables). It prints tokens/s of both, the ratio
(b)/(a) (target >= 0.8) and the child's peak RSS (flat in the token count when the
state is bounded).
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

TINY = {"kind": "tiny", "n_layers": 6, "d_model": 128, "n_heads": 4, "d_mlp": 512, "context": 128, "seed": 0}


def child(tokens: int, model: str, d_sae: int, k: int, batch_blocks: int) -> dict[str, float]:
    import torch

    from saes.cache import run_hooks
    from saes.corpus import CorpusSpec, iter_blocks
    from saes.formats.saelens import save_saelens
    from saes.models import load_model
    from saes.sae.base import SAEConfig
    from saes.sae.registry import build_sae
    from saes.summary.stream import summarize_from_model
    from store.layout import AtlasLayout

    handle = load_model(TINY if model == "tiny" else model, device="cpu")
    hooks = [f"blocks.{handle.n_layers // 4}.hook_resid_post", f"blocks.{handle.n_layers // 2}.hook_resid_post"]
    corpus = CorpusSpec(context_size=128)
    with tempfile.TemporaryDirectory() as root:
        layout = AtlasLayout(root)
        layout.update_meta(model=handle.spec)
        for i, hook in enumerate(hooks):
            sae = build_sae(SAEConfig("topk", d_in=handle.d_model, d_sae=d_sae, k=k, hook_name=hook, seed=i))
            save_saelens(sae, layout.sae_dir(f"sae{i}"))
        n_blocks = tokens // corpus.context_size
        warm = next(iter_blocks(handle.tokenizer, corpus, max_blocks=batch_blocks, batch_blocks=batch_blocks))
        run_hooks(handle, warm.token_ids, hooks)  # first-call costs out of both timings

        def bare_forward() -> float:
            start = time.perf_counter()
            for batch in iter_blocks(handle.tokenizer, corpus, max_blocks=n_blocks, batch_blocks=batch_blocks):
                run_hooks(handle, batch.token_ids, hooks)
            return time.perf_counter() - start

        before = bare_forward()
        start = time.perf_counter()
        summarize_from_model(handle, root, corpus=corpus, n_tokens=tokens, batch_blocks=batch_blocks,
                             progress=False)
        streamed = time.perf_counter() - start
        bare = min(before, bare_forward())  # timed before and after; the faster one is the baseline
    n = n_blocks * corpus.context_size
    return {"tokens": n, "bare_tok_s": n / bare, "stream_tok_s": n / streamed,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--d-sae", type=int, default=2048)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.model, args.d_sae, args.k, args.batch_blocks)))
        return
    repo = Path(__file__).resolve().parents[1]
    for tokens in args.tokens:
        cmd = [sys.executable, __file__, "--child", str(tokens), "--model", args.model, "--d-sae", str(args.d_sae),
               "--k", str(args.k), "--batch-blocks", str(args.batch_blocks)]
        out = subprocess.run(cmd, cwd=repo, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['tokens']:>9} tokens  bare forward {r['bare_tok_s']:9.0f} tok/s  streamed summary "
              f"{r['stream_tok_s']:9.0f} tok/s  ratio {r['stream_tok_s'] / r['bare_tok_s']:.2f}  "
              f"peak RSS {r['peak_rss_mb']:.0f} MB  ({r['threads']} threads)")


if __name__ == "__main__":
    main()
