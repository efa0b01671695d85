"""Caching throughput vs the bare forward pass, and peak RSS as the token count doubles.

    python bench/cache_throughput.py [--model smollm2-135m] [--tokens 8192] [--hooks 3]

Part 1 times, in this process and on the same token blocks, (a) the bare forward pass of
the model with no hooks, (b) the same forward stopped after the deepest hooked layer and
(c) `cache_activations` writing every hook to disk; it prints (c)/(a) and (c)/(b).
Part 2 runs the cache in fresh subprocesses for N and 2N tokens and prints each peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import torch


def _blocks(handle, tokens: int, context: int, batch: int):
    from sae_atlas.saes.corpus import CorpusSpec, iter_blocks

    spec = CorpusSpec(context_size=context)
    return [b.token_ids for b in iter_blocks(handle.tokenizer, spec, max_blocks=tokens // context, batch_blocks=batch)]


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since `start`; CPU time is less disturbed by other processes."""
    now = _clocks()
    return now[0] - start[0], now[1] - start[1]


def _time_forward(handle, batches, stop_at_layer=None) -> tuple[float, float]:
    start = _clocks()
    with torch.inference_mode():
        for tokens in batches:
            handle.bridge(tokens, return_type=None if stop_at_layer is None else "logits",
                          stop_at_layer=stop_at_layer)
    return _since(start)


def throughput(args) -> None:
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import load_model

    handle = load_model(args.model)
    hooks = handle.default_hooks(args.hooks)
    stop = max(handle.hook_layer(h) for h in hooks) + 1
    batches = _blocks(handle, args.tokens, args.context, args.batch)
    n_tokens = sum(b.numel() for b in batches)
    _time_forward(handle, batches[:1])  # warm-up
    bare = _time_forward(handle, batches)
    bare_stop = _time_forward(handle, batches, stop_at_layer=stop)
    with tempfile.TemporaryDirectory() as atlas:
        start = _clocks()
        cache_activations(handle, atlas, hooks, corpus=CorpusSpec(context_size=args.context),
                          n_tokens=n_tokens, batch_blocks=args.batch, progress=False)
        cached = _since(start)
    print(f"model {handle.name}, hooks {hooks}, {n_tokens} tokens, batch {args.batch} x {args.context}")
    for i, clock in enumerate(("wall", "CPU")):
        print(f"[{clock} clock]")
        print(f"  bare full forward               {n_tokens / bare[i]:9.1f} tok/s")
        print(f"  bare forward to layer {stop:<2}        {n_tokens / bare_stop[i]:9.1f} tok/s")
        print(f"  cache {len(hooks)} hooks (corpus, disk incl.) {n_tokens / cached[i]:9.1f} tok/s")
        print(f"  ratio cache / bare full forward     {bare[i] / cached[i]:.2f}  (target >= 0.9)")
        print(f"  ratio cache / bare forward to layer {bare_stop[i] / cached[i]:.2f}")


def child(args) -> None:
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import load_model

    handle = load_model(args.model)
    with tempfile.TemporaryDirectory() as atlas:
        cache_activations(handle, atlas, handle.default_hooks(args.hooks), progress=False,
                          corpus=CorpusSpec(context_size=args.context), n_tokens=args.child,
                          batch_blocks=args.batch)
    print(json.dumps({"max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def rss(args) -> None:
    for n in (args.tokens, 2 * args.tokens):
        cmd = [sys.executable, __file__, "--model", args.model, "--hooks", str(args.hooks),
               "--context", str(args.context), "--batch", str(args.batch), "--child", str(n)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(f"peak RSS caching {n:>7} tokens: {json.loads(out.splitlines()[-1])['max_rss_mb']:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hooks", type=int, default=3)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    throughput(args)
    rss(args)


if __name__ == "__main__":
    main()
