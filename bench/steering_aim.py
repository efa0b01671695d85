"""Aimed steering on an atlas: for each target token, the top result of
`Atlas.steering_features` (its best feature or its fitted combination, whichever wins on the
confirmation prompts) against every other `steer-bench` arm, each calibrated on the ranking
prompts and counted on held-out prompts of every style.

    PYTHONPATH=. nice python bench/steering_aim.py --atlas /tmp/atlas-demo \
        [--targets ' Monday' ' Friday' ' March' ' July' ' seven' ' three' ' red' ' dog'] [--sae ID ...] \
        [--prompts 8] [--confirm-prompts 8] [--candidates 12] [--combine 3] [--prompts-file mine.txt] [--ratio 3] \
        [--kl-bound 1] [--out results.json] [--plot bench.png] [--threads 2]
    PYTHONPATH=. python bench/steering_aim.py --report part1.json part2.json   # pool earlier runs' --out

The SAEs searched are `--sae`, else every SAE with a steering table (listed in the output).
Targets run one at a time and `--out` is rewritten after each, so a long run split over
processes (or killed) is pooled with `--report`. Acceptance: the top result raises
p(target) >= `--ratio` x with KL on the rest of the next-token distribution <= `--kl-bound`
nats on >= 75% of the held-out (target, prompt) pairs. Prints a markdown table of every arm
per target, the shares of pairs reached per arm and style with 95% bootstrap intervals, and
a line saying whether the top result, or else which SAE-based arm, meets the bar.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sae_atlas.saes.intervene.steer_bench import SAE_ARMS, share_table

DEFAULT_TARGETS = [" Monday", " Friday", " March", " July", " seven", " three", " red", " dog"]
ACCEPTANCE_SHARE = 0.75


def report(arms: list[dict[str, Any]], ratio: float, kl_bound: float) -> None:
    """Print the per-target table, the shares per arm and style, and the acceptance line."""
    print(f"{len(dict.fromkeys(a['target'] for a in arms))} targets; ratio {ratio:g} under KL(rest) <= "
          f"{kl_bound:g} nats, counted on the held-out prompts\n")
    print("| target | arm | feature | held-out pairs reached | norm fraction | held-out ratio | KL rest "
          "| siblings' ratio | best ratio under bound | ratio at matched norm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for a in arms:
        latents = "+".join(map(str, a["latents"])) if a["latents"] else a["latent"]
        feature = "" if latents is None else f"{a['sae_id'].split('-')[0]}/{latents}"
        frac = "" if a["norm_fraction"] is None else f"{a['norm_fraction']:.3g}"
        c = a["confirmed"]
        sib = "" if c["sibling_ratio"] is None else f"{c['sibling_ratio']:.3g}"
        print(f"| {a['target']} | {a['arm']} | {feature} | {sum(ok for _, ok in a['pairs'])}/{len(a['pairs'])} | "
              f"{frac} | {a['ratio']:.3g} | {a['kl_rest']:.3g} | {sib} | {a['best_ratio']:.3g} | "
              f"{a['matched_ratio']:.3g} |")
    shares = share_table(arms)
    print("\n| arm | style | pairs | reached | share | 95% interval |\n|---|---|---|---|---|---|")
    for row in shares:
        print(f"| {row['arm']} | {row['style']} | {row['pairs']} | {row['reached']} | {row['share']:.2f} | "
              f"{row['share_low']:.2f}-{row['share_high']:.2f} |")
    met = [r["arm"] for r in shares if r["style"] == "all" and r["share"] >= ACCEPTANCE_SHARE]
    print(f"\narms reaching {ratio:g}x under the bound on >= {ACCEPTANCE_SHARE:.0%} of pairs: {', '.join(met) or 'none'}")
    sae_met = [a for a in met if a in SAE_ARMS]
    print("the top result of steering_features meets the bar" if "top_result" in met else
          "the top result of steering_features does NOT meet the bar; "
          + (f"SAE-based arms that do: {', '.join(sae_met)}" if sae_met else
             f"no SAE-based arm meets it; arms that do: {', '.join(met) or 'none'}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atlas")
    parser.add_argument("--report", nargs="+", type=Path, help="pool earlier runs' --out files and print them")
    parser.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS)
    parser.add_argument("--sae", nargs="+", default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--confirm-prompts", type=int, default=8)
    parser.add_argument("--prompts-file", type=Path)
    parser.add_argument("--candidates", type=int, default=12)
    parser.add_argument("--combine", type=int, default=3, help="features in the fitted combination")
    parser.add_argument("--ratio", type=float, default=3.0)
    parser.add_argument("--kl-bound", type=float, default=1.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.report:
        runs = [json.loads(p.read_text()) for p in args.report]
        report([a for r in runs for a in r["arms"]], runs[0]["ratio_requested"], runs[0]["kl_bound"])
        return
    if not args.atlas:
        parser.error("give --atlas (to run) or --report (to pool earlier runs)")
    import torch

    from sae_atlas.api.atlas import Atlas
    from sae_atlas.store.steering import STEERING_META

    torch.set_num_threads(args.threads)
    atlas = Atlas(args.atlas)
    saes = args.sae or [s for s in atlas.sae_ids if (atlas.root / "saes" / s / STEERING_META).exists()]
    print(f"SAEs searched: {saes}")
    started = time.perf_counter()
    result = None
    for target in args.targets:  # one at a time: each target's rows are written as it finishes
        one = atlas.steer_bench([target], saes=saes, ratio=args.ratio, kl_bound=args.kl_bound, n_prompts=args.prompts,
                                candidates=args.candidates, confirm_prompts=args.confirm_prompts,
                                prompts=args.prompts_file or (), combine=args.combine)
        if result is None:
            result = one
        else:
            result.arms += one.arms
            result.shares = share_table(result.arms)
        print(f"{target!r} done at {time.perf_counter() - started:.0f} s", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result.to_dict(), indent=1))
    if result is None:
        return
    if args.plot:
        result.plot(args.plot)
    print(f"{time.perf_counter() - started:.0f} s")
    report(result.arms, args.ratio, args.kl_bound)


if __name__ == "__main__":
    main()
