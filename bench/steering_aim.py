"""Aimed steering on an atlas: for each target token, the top-ranked feature of
`Atlas.steering_features` and its fitted combination at their calibrated strengths against
the naive top-activating feature and the other `steer-bench` arms, each calibrated on the
ranking prompts and counted on held-out prompts of every style, in one run.

    PYTHONPATH=. nice python bench/steering_aim.py --atlas /tmp/atlas-demo \
        [--targets ' Monday' ' Friday' ' March' ' July' ' seven' ' three' ' red' ' dog'] [--prompts 8] \
        [--confirm-prompts 8] [--candidates 12] [--prompts-file mine.txt] [--ratio 3] [--kl-bound 1] \
        [--out results.json] [--plot bench.png] [--threads 2]

Only the SAEs that have a steering table are searched (listed in the output). Acceptance:
an SAE-based arm (best feature or combination) raises p(target) >= `--ratio` x with KL on
the rest of the next-token distribution <= `--kl-bound` nats on >= 75% of the held-out
(target, prompt) pairs. Prints a markdown table of every arm per target and the shares of
pairs reached per arm and style, with 95% bootstrap intervals.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from sae_atlas.api.atlas import Atlas
from sae_atlas.saes.intervene.steer_bench import SAE_ARMS, share_table
from sae_atlas.store.steering import STEERING_META

DEFAULT_TARGETS = [" Monday", " Friday", " March", " July", " seven", " three", " red", " dog"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atlas", required=True)
    parser.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--confirm-prompts", type=int, default=8)
    parser.add_argument("--prompts-file", type=Path)
    parser.add_argument("--candidates", type=int, default=12)
    parser.add_argument("--ratio", type=float, default=3.0)
    parser.add_argument("--kl-bound", type=float, default=1.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    atlas = Atlas(args.atlas)
    saes = [s for s in atlas.sae_ids if (atlas.root / "saes" / s / STEERING_META).exists()]
    print(f"SAEs with steering tables: {saes}")
    started = time.perf_counter()
    result = None
    for target in args.targets:  # one at a time: each target's rows are written as it finishes
        one = atlas.steer_bench([target], saes=saes, ratio=args.ratio, kl_bound=args.kl_bound, n_prompts=args.prompts,
                                candidates=args.candidates, confirm_prompts=args.confirm_prompts,
                                prompts=args.prompts_file or ())
        if result is None:
            result = one
        else:
            result.arms += one.arms
            result.shares = share_table(result.arms)
        print(f"{target!r} done at {time.perf_counter() - started:.0f} s", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result.to_dict(), indent=1))
    seconds = time.perf_counter() - started
    if args.plot:
        result.plot(args.plot)
    print(f"{len(args.targets)} targets in {seconds:.0f} s; ratio {args.ratio:g} under KL(rest) <= "
          f"{args.kl_bound:g} nats\n")
    print("| target | arm | feature | reached | norm fraction | ratio | KL rest | best ratio under bound "
          "| ratio at matched norm | KL rest at matched norm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for a in result.arms:
        latents = "+".join(map(str, a["latents"])) if a["latents"] else a["latent"]
        feature = "" if latents is None else f"{a['sae_id'].split('-')[0]}/{latents}"
        frac = "" if a["norm_fraction"] is None else f"{a['norm_fraction']:.3g}"
        print(f"| {a['target']} | {a['arm']} | {feature} | {'yes' if a['reached'] else 'no'} | {frac} | "
              f"{a['ratio']:.3g} | {a['kl_rest']:.3g} | {a['best_ratio']:.3g} | {a['matched_ratio']:.3g} | "
              f"{a['matched_kl_rest']:.3g} |")
    print("\n| arm | style | pairs | reached | share | 95% interval |\n|---|---|---|---|---|---|")
    for row in result.shares:
        print(f"| {row['arm']} | {row['style']} | {row['pairs']} | {row['reached']} | {row['share']:.2f} | "
              f"{row['share_low']:.2f}-{row['share_high']:.2f} |")
    met = [r["arm"] for r in result.shares if r["style"] == "all" and r["share"] >= 0.75]
    print(f"\narms reaching {args.ratio:g}x under the bound on >= 75% of pairs: {', '.join(met) or 'none'}")
    print("the top result of steering_features meets the bar" if "top_result" in met else
          "the top result of steering_features does NOT meet the bar" + (
              f"; SAE-based arms that do: {', '.join(a for a in met if a in SAE_ARMS)}"
              if set(met) & set(SAE_ARMS) else "; no SAE-based arm meets the bar"))

if __name__ == "__main__":
    main()
