"""Streamed summaries (`summarize --from-model`) against a bare forward, and their peak memory.

    python bench/summarize_stream.py [--tokens 20000,200000] [--model tiny|smollm2-135m]
                                     [--layers 7,15] [--corpus builtin|PATH] [--d-sae 2048]
                                     [--k 32] [--batch-blocks 8] [--bare-tokens N]

For each token count a fresh child process builds an atlas with random TopK SAEs on the
hooks `blocks.L.hook_resid_post` of `--layers` (default: a quarter and half way down the
model), then, over the same corpus blocks, times (a) the bare forward of
`saes.forward.run_hooks` to the deepest hooked layer (before and after (b); the faster of
the two is the baseline, to damp load from other processes) and (b) `summarize_from_model`
(the same forward plus every SAE's accumulators, occurrence spool, checkpoints and the
written tables). `--bare-tokens N` times (a) over the first N of those tokens only (a rate
needs no 1M-token pass). It prints tokens/s of both, the ratio (b)/(a) (target >= 0.8),
the child's peak RSS before the summary (model loaded, bare forwards run) and at the end
(flat in the token count when the summary state is bounded), and the wall time of (b).

(b) includes costs that do not grow with the tokens: writing the tables, and above all the
logit effects (`W_dec @ W_U`, d_sae x d_model x d_vocab multiply-adds per SAE). With two or
more token counts the script also prints the marginal rate between consecutive counts,
`(N2 - N1) / (t2 - t1)`, i.e. the streaming throughput with those fixed costs taken out,
its ratio to the faster of the two runs' bare forwards, and the fixed cost `t1 - N1 / rate`.
The children inherit `OMP_NUM_THREADS` (and `TMPDIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = {"kind": "tiny", "n_layers": 6, "d_model": 128, "n_heads": 4, "d_mlp": 512, "context": 128, "seed": 0}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(tokens: int, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
    from sae_atlas.saes.formats.saelens import save_saelens
    from sae_atlas.saes.forward import run_hooks
    from sae_atlas.saes.models import load_model
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig
    from sae_atlas.saes.summary.stream import summarize_from_model
    from sae_atlas.store.layout import AtlasLayout

    handle = load_model(TINY if args.model == "tiny" else args.model, device="cpu")
    layers = args.layers or [handle.n_layers // 4, handle.n_layers // 2]
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    corpus = CorpusSpec(source=args.corpus, context_size=128)
    batch_blocks = args.batch_blocks
    with tempfile.TemporaryDirectory() as root:
        layout = AtlasLayout(root)
        layout.update_meta(model=handle.spec)
        for i, hook in enumerate(hooks):
            sae = build_sae(SAEConfig("topk", d_in=handle.d_model, d_sae=args.d_sae, k=args.k, hook_name=hook, seed=i))
            save_saelens(sae, layout.sae_dir(f"sae{i}"))
        n_blocks = tokens // corpus.context_size
        bare_blocks = min(n_blocks, (args.bare_tokens or tokens) // corpus.context_size)
        warm = next(iter_blocks(handle.tokenizer, corpus, max_blocks=batch_blocks, batch_blocks=batch_blocks))
        run_hooks(handle, warm.token_ids, hooks)  # first-call costs out of both timings

        def bare_forward() -> float:
            start = time.perf_counter()
            for batch in iter_blocks(handle.tokenizer, corpus, max_blocks=bare_blocks, batch_blocks=batch_blocks):
                run_hooks(handle, batch.token_ids, hooks)
            return time.perf_counter() - start

        before = bare_forward()
        rss_before = peak_rss_mb()
        start = time.perf_counter()
        summarize_from_model(handle, root, corpus=corpus, n_tokens=tokens, batch_blocks=batch_blocks,
                             progress=False)
        streamed = time.perf_counter() - start
        rss_after = peak_rss_mb()
        bare = min(before, bare_forward())  # timed before and after; the faster one is the baseline
    n = n_blocks * corpus.context_size
    return {"tokens": n, "bare_tokens": bare_blocks * corpus.context_size,
            "bare_tok_s": bare_blocks * corpus.context_size / bare, "stream_tok_s": n / streamed,
            "stream_s": streamed, "rss_before_mb": rss_before, "peak_rss_mb": rss_after,
            "hooks": ",".join(hooks), "threads": torch.get_num_threads()}


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int_list, default=[20_000, 200_000], help="comma-separated token counts")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layers", type=int_list, default=None, help="hooked blocks, e.g. 1,3")
    parser.add_argument("--corpus", default="builtin")
    parser.add_argument("--bare-tokens", type=int, default=None, help="time the bare forward on this many tokens")
    parser.add_argument("--d-sae", type=int, default=2048)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    repo = Path(__file__).resolve().parents[1]
    options = ["--model", args.model, "--corpus", args.corpus, "--d-sae", str(args.d_sae), "--k", str(args.k),
               "--batch-blocks", str(args.batch_blocks)]
    options += ["--layers", ",".join(map(str, args.layers))] if args.layers else []
    options += ["--bare-tokens", str(args.bare_tokens)] if args.bare_tokens else []
    runs = []
    for tokens in args.tokens:
        cmd = [sys.executable, __file__, *options, "--child", str(tokens)]
        passed = {k: v for k, v in os.environ.items() if k in ("TMPDIR", "OMP_NUM_THREADS")}
        env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", **passed}
        out = subprocess.run(cmd, cwd=repo, env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"child for {tokens} tokens failed:\n{out.stderr[-4000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['tokens']:>9} tokens ({r['hooks']})  bare forward {r['bare_tok_s']:7.0f} tok/s "
              f"(over {r['bare_tokens']})  streamed summary {r['stream_tok_s']:7.0f} tok/s in {r['stream_s']:.0f} s  "
              f"ratio {r['stream_tok_s'] / r['bare_tok_s']:.2f}  peak RSS {r['rss_before_mb']:.0f} MB before the "
              f"summary, {r['peak_rss_mb']:.0f} MB at the end  ({r['threads']} threads)", flush=True)
        runs.append(r)
    for small, large in zip(runs, runs[1:], strict=False):
        rate = (large["tokens"] - small["tokens"]) / (large["stream_s"] - small["stream_s"])
        bare = max(small["bare_tok_s"], large["bare_tok_s"])
        print(f"marginal {small['tokens']} -> {large['tokens']} tokens: streamed summary {rate:7.0f} tok/s, "
              f"bare forward {bare:7.0f} tok/s (the faster of the two runs), ratio {rate / bare:.2f}; "
              f"fixed cost {small['stream_s'] - small['tokens'] / rate:.0f} s", flush=True)


if __name__ == "__main__":
    main()
