"""Steered generation with the KV cache against the path it replaced, in one run.

    PYTHONPATH=. python bench/steer_generation.py --model smollm2-135m [--new-tokens 64] \
        [--atlas /tmp/atlas-demo] [--hook blocks.15.hook_resid_post] [--sweep 4]

One SAE spliced at `--hook` with one steer edit at every position, greedy decoding of
`--new-tokens` tokens from a ~20-token prompt:

- full forward: the path before the KV cache, kept here as the reference: every new token
  runs the model on the whole sequence so far;
- KV cache: `saes.intervene.generate.generate_tokens` (each new token runs the new
  position only).

Both must produce the same tokens. Target: KV cache >= 3x the full-forward tokens/s.
`--sweep N` also times N steer strengths of the prompt as one batch (`generate_batch`)
against the same N generated one by one with the cache.

The SAE is the atlas's SAE at `--hook` when `--atlas` names an atlas that has one (read
only), else a random TopK SAE built from a config: the cost does not depend on what it learned.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sae_atlas.saes.atlas_saes import atlas_sae_hook, load_atlas_sae
from sae_atlas.saes.intervene.edits import SteerEdit, compile_edit, resolve_positions
from sae_atlas.saes.intervene.generate import generate_batch, generate_tokens
from sae_atlas.saes.intervene.splice import Splice
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.store.layout import AtlasLayout

PROMPT = "The old lighthouse keeper climbed the stairs every evening, and tonight the sea below him was"


def full_forward_generation(handle: ModelHandle, prompt_T: torch.Tensor, splice: Splice, n_new: int) -> list[int]:
    """Greedy tokens the way they were generated before the KV cache: one forward pass of
    the whole sequence per new token."""
    ids = prompt_T.clone()
    hooks = splice.fwd_hooks()
    new = []
    with torch.inference_mode():
        for _ in range(n_new):
            nxt = int(handle.bridge.run_with_hooks(ids[None], fwd_hooks=hooks)[0, -1].argmax())
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([nxt])])
    return new


def pick_sae(handle: ModelHandle, atlas: Path | None, hook: str, d_sae: int) -> tuple[str, SAE]:
    """(description, SAE at `hook`): the atlas's, else a random TopK SAE."""
    if atlas is not None and (atlas / "atlas.json").is_file():
        for sae_id in AtlasLayout(atlas).sae_ids():
            if atlas_sae_hook(atlas, sae_id) == hook:
                return f"atlas SAE {sae_id}", load_atlas_sae(atlas, sae_id)
    cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=d_sae, k=32, hook_name=hook, seed=0)
    return f"random TopK SAE (d_sae {d_sae}, k 32)", build_sae(cfg).eval()


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Smallest wall time of `repeats` calls (seconds) and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--atlas", type=Path, default=Path("/tmp/atlas-demo"))
    parser.add_argument("--hook", default="blocks.15.hook_resid_post")
    parser.add_argument("--d-sae", type=int, default=4608, help="of the random SAE (no atlas SAE at the hook)")
    parser.add_argument("--feature", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument("--sweep", type=int, default=0, help="also time this many steer strengths as one batch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    handle = load_model(args.model)
    described, sae = pick_sae(handle, args.atlas, args.hook, args.d_sae)
    prompt = handle.to_tokens(args.prompt)[0]
    n = args.new_tokens

    def steered(alpha: float) -> Splice:
        mask = resolve_positions("all", [], len(prompt), len(prompt) + n)
        edit = compile_edit(SteerEdit(sae="s", feature=args.feature, alpha=alpha), mask, sae=sae, hook=args.hook)
        return Splice({"s": (args.hook, sae)}, [edit])

    splice = steered(args.alpha)
    generate_tokens(handle, prompt, splice, max_new_tokens=2, stop_at_eos=False)  # warm-up
    t_full, full_ids = timed(lambda: full_forward_generation(handle, prompt, splice, n), args.repeats)
    t_kv, (kv_ids, _) = timed(lambda: generate_tokens(handle, prompt, splice, max_new_tokens=n, stop_at_eos=False),
                              args.repeats)
    print(f"{args.model}, {described} at {args.hook}, steer feature {args.feature} alpha {args.alpha:g} at every "
          f"position; prompt {len(prompt)} tokens, {n} new tokens (greedy), {args.threads} threads")
    print(f"  full forward per token  {n / t_full:8.1f} tokens/s")
    print(f"  KV cache                {n / t_kv:8.1f} tokens/s   ratio {t_full / t_kv:5.2f}x  (target >= 3)")
    print(f"  same tokens: {full_ids == kv_ids}; continuation {handle.tokenizer.decode(kv_ids)!r}")
    if args.sweep:
        alphas = [args.alpha * (i + 1) / args.sweep for i in range(args.sweep)]
        splices = [steered(a) for a in alphas]
        t_one, one = timed(lambda: [generate_tokens(handle, prompt, s, max_new_tokens=n, stop_at_eos=False)[0]
                                    for s in splices], args.repeats)
        t_batch, batch = timed(lambda: [ids for ids, _ in generate_batch(
            handle, [prompt] * len(splices), splices, max_new_tokens=n, stop_at_eos=False)], args.repeats)
        total = n * len(splices)
        print(f"  sweep of {len(splices)} strengths, one by one   {total / t_one:8.1f} tokens/s")
        print(f"  sweep of {len(splices)} strengths, one batch    {total / t_batch:8.1f} tokens/s   "
              f"ratio {t_one / t_batch:5.2f}x; same tokens: {one == batch}")


if __name__ == "__main__":
    main()
