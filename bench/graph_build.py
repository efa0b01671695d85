"""Attribution-graph build time against one forward plus backward pass on the same prompt,
the graph's size before and after pruning, and ablations of its top nodes, in one run.

    PYTHONPATH=. python bench/graph_build.py [--atlas /tmp/atlas-demo] [--model smollm2-135m] \
        [--prompt "..."] [--target " Wednesday"] [--batch 128] [--repeats 3] [--threads 2]

The graph is built over the atlas's transcoders when it has one per MLP (or, with
`--freeze-mlps`, over the transcoders it has, the other MLPs frozen), else over its
residual-stream SAEs (the demo atlas: TopK SAEs at blocks.{8,15,22}.hook_resid_post). The
baseline is the model's own forward and backward pass on the prompt (the gradient of the
target logit with respect to every parameter). Target: build <= 10x the baseline.

Then the graph's 5 most influential feature nodes are ablated together in the replacement
model (downstream features re-encoding, errors fixed) and so are 5 random active feature
nodes whose features' firing densities match theirs (same SAE, nearest density in the
summaries, seeded); the change of the target's demeaned logit is printed for both.
"""

from __future__ import annotations

import argparse
import statistics
import time

import polars as pl
import torch

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.graph import graph_saes
from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.node_interventions import (
    NodeEdit,
    density_matched,
    influence_ranked,
    intervene,
)
from sae_atlas.saes.circuits.prune import prune, scores
from sae_atlas.saes.intervene.attribution import token_id

PROMPT = "Let's do some days of the week math. Two days from Monday is"


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atlas", default="/tmp/atlas-demo")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--target", default=" Wednesday")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--freeze-mlps", action="store_true",
                    help="use the atlas's transcoders, the MLPs they miss frozen (their outputs error nodes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    atlas = Atlas(args.atlas)
    handle = atlas.model()
    views = [atlas.sae(s) for s in atlas.sae_ids]
    saes = graph_saes(atlas.ctx, views, chosen=False, freeze_mlps=args.freeze_mlps)
    tokens = handle.to_tokens(args.prompt)[0]
    target = token_id(handle.tokenizer, args.target)
    print(f"prompt {args.prompt!r}: {len(tokens)} tokens; dictionaries: {', '.join(saes)}")

    def forward_backward() -> None:
        handle.bridge.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits = handle.bridge(tokens[None])
            logits[0, -1, target].backward()

    graph_holder = {}

    def build() -> None:
        graph_holder["g"] = build_graph(handle, saes, tokens, targets=[args.target], batch_size=args.batch,
                                        freeze_mlps=args.freeze_mlps)

    base = _median_seconds(forward_backward, args.repeats)
    handle.bridge.zero_grad(set_to_none=True)
    built = _median_seconds(build, args.repeats)
    g = graph_holder["g"]
    p = prune(g)
    kept = p.edge_mask & p.node_mask[:, None] & p.node_mask[None]
    full, pruned = scores(g), scores(g, g.adjacency * kept)
    print(f"kind {g.kind}; {g.n_features} active features, {g.settings['backward_passes']} backward passes "
          f"of {args.batch} rows")
    print(f"forward+backward {base * 1e3:.1f} ms; graph build {built * 1e3:.1f} ms; ratio {built / base:.1f}x "
          f"(target <= 10x)")
    print(f"nodes {g.n_nodes} -> {int(p.node_mask.sum())}; edges {int((g.adjacency != 0).sum())} -> "
          f"{int(kept.sum())} after pruning (0.8 / 0.98)")
    print(f"replacement {full.replacement:.3f} -> {pruned.replacement:.3f}; "
          f"completeness {full.completeness:.3f} -> {pruned.completeness:.3f}")

    ranked = influence_ranked(g)  # kept or not
    top = ranked[:5]
    f = g.features
    summarized = [sid for sid in g.dictionaries if sid in atlas.sae_ids and atlas.sae(sid).summarized]
    labels = {sid: dict(atlas.sae(sid).labels_by_latent().select("latent", "label").iter_rows()) for sid in summarized}
    print("most influential feature nodes (dictionary, latent, token: offline label):")
    for i in ranked[:10]:
        sid, lat = g.dictionaries[int(f.dictionary[i])], int(f.latent[i])
        print(f"  {sid} {lat:5d} {g.tokens[int(f.pos[i])]!r:>10}: {labels.get(sid, {}).get(lat) or ''}")
    # firing density from the summaries; an unsummarized dictionary matches on the activation instead
    dens = {sid: pl.read_parquet(atlas.sae(sid).folder / "features.parquet")["density"].to_numpy()
            for sid in summarized}

    def density(j: int) -> float:
        sid = g.dictionaries[int(f.dictionary[j])]
        return float(dens[sid][int(f.latent[j])]) if sid in dens else float(f.activation[j])

    chosen = density_matched(g, top, density, seed=args.seed)
    for name, nodes in (("top 5 graph nodes", top), ("5 density-matched random active features", chosen)):
        r = intervene(handle, g, [NodeEdit("ablate", nodes)])
        print(f"ablating {name}: target {args.target!r} demeaned logit {r.clean[0]:.3f} changes by "
              f"{r.measured[0]:+.3f} (graph: direct {r.direct[0]:+.3f}, total {r.total[0]:+.3f})")


if __name__ == "__main__":
    main()
