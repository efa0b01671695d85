"""Cost of the cheap logit-lens screens per 1k features, against one forward and against
measuring every feature, on an SAE of an atlas, in one run.

    PYTHONPATH=. python bench/steering_screen.py --atlas /tmp/atlas-demo \
        --sae blocks.15.hook_resid_post-topk-4608 [--lens-z 5] [--target ' Friday'] [--prompts 16] \
        [--prompt-tokens 12] [--measure 32] [--chunk 16] [--threads 1]

Timed, best of `--repeat` where cheap:

- one forward: the `--prompts` neutral prompts as one batch, no hooks (the unit of cost);
- measuring: `output_scores.steering_chunk` on `--measure` live latents (the last-token
  trick over the prompts, what `steering-scores` does per latent), scaled to 1k;
- the table's screen: `output_scores.screened_latents` at `--lens-z` over every latent
  (each decoder row through the final norm and the unembedding), scaled to 1k; with the
  share of latents it passes, a screened table costs `screen + share x measuring` per 1k;
- the search's screen: `steering_search._candidates` for `--target` over every latent (the
  target's z-scored lens logit less its siblings', plus the stored table's promoted
  tokens), scaled to 1k; the search then measures only its `candidates` per SAE.

When the atlas's steering table holds every latent, it also prints how many of the table's
best latents (top 10% by output score, and by largest promoted log-probability change) the
table's screen keeps, against the share it keeps of all: a screen no better than chance
keeps the same share of both.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.steering import steering_source
from sae_atlas.saes.intervene.output_scores import (
    last_token_steering,
    lens_token_matrix,
    neutral_prompts,
    screened_latents,
    steering_chunk,
)
from sae_atlas.saes.intervene.steering_prompts import target_class
from sae_atlas.saes.intervene.steering_search import DENSITY_FLOOR, _candidates, resolve_target


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The fastest of `repeat` timed calls, seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atlas", required=True)
    parser.add_argument("--sae", required=True)
    parser.add_argument("--lens-z", type=float, default=5.0)
    parser.add_argument("--target", default=" Friday")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=12)
    parser.add_argument("--measure", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    atlas = Atlas(args.atlas)
    handle = atlas.model()
    source = steering_source(atlas.sae(args.sae), reads_its_hook=False)
    W_dec = source.sae.W_dec.detach()
    n_latents = len(W_dec)
    alpha = 10.0 * np.nan_to_num(source.mean_active_act_F.astype(np.float32))
    prompts = neutral_prompts(handle, args.prompts, args.prompt_tokens, seed=0)
    per_1k = 1000 / n_latents

    with torch.inference_mode():
        handle.bridge.forward(prompts)  # warm-up
        t_forward = best_of(args.repeat, lambda: handle.bridge.forward(prompts))

    live = np.flatnonzero(alpha > 0)[:args.measure]
    lens = lens_token_matrix(atlas.sae(args.sae).tables().features["top_logit_ids"].to_list(), args.sae)
    start = time.perf_counter()
    with last_token_steering(handle, prompts, source.hook) as steered:
        clean = steered(torch.zeros(1, handle.d_model))[0]
        for lo in range(0, len(live), args.chunk):
            part = live[lo:lo + args.chunk]
            steering_chunk(steered, clean, W_dec[torch.as_tensor(part)], part, alpha[part], lens[torch.as_tensor(part)],
                           top_k=10)
    t_measure = (time.perf_counter() - start) / len(live) * 1000

    passed: list[np.ndarray] = []
    t_table = best_of(args.repeat, lambda: passed.append(screened_latents(handle, W_dec, alpha, args.lens_z)))
    share = len(passed[-1]) / n_latents
    target = resolve_target(handle.tokenizer, args.target, handle.d_vocab)
    siblings = target_class(handle.tokenizer, target.token_ids, handle.d_vocab, target.kind).sibling_ids
    alive = np.nan_to_num(source.density_F, nan=0.0) >= DENSITY_FLOOR if source.density_F is not None \
        else np.ones(n_latents, bool)
    t_search = best_of(args.repeat, lambda: _candidates(handle, source, target, 24, None, alive, siblings))

    print(f"{handle.name}, SAE {args.sae} ({n_latents} latents), {args.prompts} prompts x {args.prompt_tokens} "
          f"tokens, {args.threads} thread(s)")
    print(f"  one forward of the prompts              {t_forward * 1e3:9.1f} ms")
    print(f"  measuring, per 1k latents               {t_measure:9.2f} s = {t_measure / t_forward:7.0f} forwards")
    print(f"  table screen (lens z), per 1k latents   {t_table * per_1k:9.2f} s = {t_table * per_1k / t_forward:7.1f} "
          f"forwards; passes {share:.1%} at z >= {args.lens_z:g}")
    screened = t_table * per_1k + share * t_measure
    print(f"  screened table, per 1k latents          {screened:9.2f} s = {screened / t_forward:7.0f} forwards; "
          f"{t_measure / screened:.2f}x cheaper than measuring every latent")
    print(f"  search screen for {args.target!r}, per 1k latents {t_search * per_1k:6.2f} s = "
          f"{t_search * per_1k / t_forward:7.1f} forwards (then 24 candidates measured per SAE)")
    table = source.table.sort("latent")
    if table.height == n_latents:
        kept = np.zeros(n_latents, bool)
        kept[passed[-1]] = True
        top_delta = np.array([d[0] if len(d) else 0.0 for d in table["promoted_deltas"].to_list()])
        for name, value in (("output score", table["output_score"].to_numpy()), ("top promoted change", top_delta)):
            best = (alpha > 0) & (value >= np.percentile(value[alpha > 0], 90))
            print(f"  of the table's top 10% by {name}, the screen keeps {kept[best].mean():.1%} "
                  f"(of all live latents {kept[alpha > 0].mean():.1%})")


if __name__ == "__main__":
    main()
