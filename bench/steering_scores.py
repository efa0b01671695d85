"""Cost of output scores per 1k features, against one forward of the prompts, in one run.

    PYTHONPATH=. python bench/steering_scores.py [--model '{"kind": "tiny", "n_layers": 4}'] \
        [--d-sae 512] [--prompts 16] [--prompt-tokens 12] [--chunk 32] [--threads 1]

A random TopK SAE at `--hook` (the cost does not depend on what it learned); every feature
is steered at the last token of `--prompts` neutral prompts:

- one forward: the prompts as one batch, no hooks (the unit of cost);
- last-token trick: `saes.intervene.output_scores` (prefixes once into a KV cache, then one
  batch row per (feature, prompt) running the last token only, plus the scoring);
- full forward per feature: the prompts as one batch with a steer hook at the last
  position, one pass per feature (timed on `--naive` features, scaled to 1k).

Both give the same logits (checked on the naive features).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from sae_atlas.saes.intervene.output_scores import (
    last_token_steering,
    lens_token_matrix,
    neutral_prompts,
    steering_chunk,
)
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default='{"kind": "tiny", "n_layers": 4, "d_model": 64, "d_mlp": 256}')
    parser.add_argument("--hook", default="blocks.1.hook_resid_post")
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=12)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--naive", type=int, default=32, help="features timed with a full forward each")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = json.loads(args.model) if args.model.lstrip().startswith("{") else args.model
    handle = load_model(model, cache=False)
    sae = build_sae(SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=args.d_sae, k=32,
                              hook_name=args.hook, seed=0)).eval()
    W_dec = sae.W_dec.detach()
    prompts = neutral_prompts(handle, args.prompts, args.prompt_tokens, seed=0)
    lens = torch.zeros(args.d_sae, 8, dtype=torch.long) + torch.arange(8)
    alpha = np.full(args.d_sae, 4.0, np.float32)

    with torch.inference_mode():
        handle.bridge.forward(prompts)  # warm-up
        t_forward = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            handle.bridge.forward(prompts)
            t_forward = min(t_forward, time.perf_counter() - start)

    start = time.perf_counter()
    with last_token_steering(handle, prompts, args.hook) as steered:
        clean = steered(torch.zeros(1, handle.d_model))[0]
        for lo in range(0, args.d_sae, args.chunk):
            part = slice(lo, min(lo + args.chunk, args.d_sae))
            steering_chunk(steered, clean, W_dec[part], np.arange(part.start, part.stop), alpha[part],
                           lens_token_matrix(lens[part].tolist(), "bench"), top_k=10)
        fast = steered(torch.as_tensor(alpha[: args.naive, None]) * W_dec[: args.naive])
    t_trick = time.perf_counter() - start

    delta: dict[str, torch.Tensor] = {}

    def add_at_last(act: torch.Tensor, hook: object = None) -> torch.Tensor:
        act = act.clone()
        act[:, -1] += delta["D"].to(act)
        return act

    start = time.perf_counter()
    worst = 0.0
    with torch.inference_mode(), handle.bridge.hooks(fwd_hooks=[(args.hook, add_at_last)]):
        for f in range(args.naive):
            delta["D"] = float(alpha[f]) * W_dec[f]
            logits = handle.bridge.forward(prompts)[:, -1].float()
            worst = max(worst, float((logits - fast[f]).abs().max()))
    t_naive = (time.perf_counter() - start) / args.naive * args.d_sae

    per_1k = 1000 / args.d_sae
    print(f"{handle.name} (d_model {handle.d_model}, {handle.n_layers} layers), random TopK SAE d_sae {args.d_sae} "
          f"at {args.hook}; {args.prompts} prompts x {args.prompt_tokens} tokens, chunk {args.chunk}, "
          f"{args.threads} thread(s)")
    print(f"  one forward of the prompts (best of 5){t_forward * 1e3:8.2f} ms")
    print(f"  last-token trick, per 1k features      {t_trick * per_1k:8.2f} s  = {t_trick * per_1k / t_forward:8.0f} forwards")
    print(f"  full forward per feature, per 1k       {t_naive * per_1k:8.2f} s  = {t_naive * per_1k / t_forward:8.0f} forwards")
    print(f"  ratio {t_naive / t_trick:5.2f}x; max |logit difference| {worst:.2e}")


if __name__ == "__main__":
    main()
