"""Cost of interventions on SmolLM2-135M, against baselines measured in the same run.

    python bench/intervene.py [--saes 3] [--d-sae 4608] [--prompts 8] [--new-tokens 32]

1. Attribution: `saes.intervene.attribution.attribute` (SAEs spliced at `--saes` residual
   hooks, the model linearised, one forward and one backward pass) per prompt, against one
   forward + backward of the bare model (gradient of the same logit with respect to the
   embeddings, no weight gradients). Target: ratio <= 3. The ablation check (`verify`)
   costs one extra forward per verified feature and is timed separately.
2. Generation: greedy tokens/s with one SAE spliced and a steer edit at every position,
   against plain generation (the same loop, no hooks). Target: ratio >= 0.8.

The SAEs are TopK SAEs with random weights: cost does not depend on what they learned.
"""

from __future__ import annotations

import argparse
import time

import torch

from sae_atlas.saes.intervene.attribution import Target, attribute
from sae_atlas.saes.intervene.edits import SteerEdit, compile_edit
from sae_atlas.saes.intervene.generate import generate_tokens
from sae_atlas.saes.intervene.splice import Splice
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

PROMPTS = [
    "Today is Monday, so tomorrow is",
    "The capital of France is Paris, and the capital of Germany is",
    "def add(a, b):\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "Let's do some days of the week math. Two days from Friday is",
    "The quick brown fox jumps over the lazy",
    "In 1969, the first humans landed on the",
    "She opened the door and saw that the room was",
]


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of `repeats` calls (seconds)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bare_forward_backward(handle, tokens_T: torch.Tensor, token: int) -> None:
    """One forward + backward of the unhooked model: d logit / d embeddings."""

    def leaf(act, hook=None):
        return act.detach().requires_grad_(True)

    with torch.enable_grad():
        saved = [p.requires_grad for p in handle.bridge.parameters()]
        for p in handle.bridge.parameters():
            p.requires_grad_(False)
        try:
            logits = handle.bridge.run_with_hooks(tokens_T[None], fwd_hooks=[("hook_embed", leaf)])
            logits[0, -1, token].backward()
        finally:
            for p, flag in zip(handle.bridge.parameters(), saved, strict=True):
                p.requires_grad_(flag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saes", type=int, default=3, help="SAEs spliced for attribution (spread over depth)")
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    handle = load_model("smollm2-135m")
    hooks = handle.default_hooks(args.saes)
    saes = {}
    for i, hook in enumerate(hooks):
        cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=args.d_sae, k=32, hook_name=hook, seed=i)
        saes[f"sae{i}"] = (hook, build_sae(cfg).eval())
    prompts = [handle.to_tokens(p)[0] for p in PROMPTS[: args.prompts]]
    token = int(handle.tokenizer(" the", add_special_tokens=False)["input_ids"][0])
    target = Target(kind="logit", token=token)
    splice = Splice(saes)
    attribute(handle, prompts[0], splice, target, verify=0)  # warm-up
    bare = sum(best_of(lambda t=t: bare_forward_backward(handle, t, token)) for t in prompts)
    attr = sum(best_of(lambda t=t: attribute(handle, t, splice, target, verify=0)) for t in prompts)
    verified = sum(best_of(lambda t=t: attribute(handle, t, splice, target, verify=5), 1) for t in prompts)
    n = len(prompts)
    print(f"SmolLM2-135M, {args.saes} TopK SAEs (d_sae {args.d_sae}) at {', '.join(hooks)}; {n} prompts, "
          f"{args.threads} threads")
    print(f"  bare forward+backward   {bare / n * 1e3:8.1f} ms / prompt")
    print(f"  attribution (verify=0)  {attr / n * 1e3:8.1f} ms / prompt   ratio {attr / bare:5.2f}x  (target <= 3)")
    print(f"  attribution (verify=5)  {verified / n * 1e3:8.1f} ms / prompt   ratio {verified / bare:5.2f}x")

    prompt = prompts[0]
    hook, sae = saes["sae0"]
    every = torch.ones(len(prompt) + args.new_tokens, dtype=torch.bool)
    steer = compile_edit(SteerEdit(sae="sae0", feature=0, alpha=2.0), every, sae=sae, hook=hook)
    plain, steered = Splice(), Splice({"sae0": (hook, sae)}, [steer])

    def gen(splice: Splice) -> None:
        generate_tokens(handle, prompt, splice, max_new_tokens=args.new_tokens, stop_at_eos=False)

    gen(plain)
    t_plain, t_steer = best_of(lambda: gen(plain)), best_of(lambda: gen(steered))
    print(f"  plain generation        {args.new_tokens / t_plain:8.1f} tokens/s")
    print(f"  steered generation      {args.new_tokens / t_steer:8.1f} tokens/s   ratio {t_plain / t_steer:5.2f}"
          "  (target >= 0.8)")


if __name__ == "__main__":
    main()
