"""A complete transcoder set for SmolLM2: skip-transcoders (TopK) at all 30 MLPs trained in
one streamed pass, their quality, and attribution graphs over the set beside the residual-SAE
graph of the same prompts.

    PYTHONPATH=. python bench/transcoder_set.py --atlas /tmp/trainbench/tc-atlas \
        [--residual-atlas /tmp/democlone/atlas-demo] [--tokens 61440] [--d-sae 2304] [--k 32] \
        [--batch-size 1024] [--buffer-tokens 16384] [--ce-blocks 8] [--out result.json] \
        [--device cuda] [--prompts 3] [--corpus builtin|FILE_OR_FOLDER]

1. Training (`saes.train_from_model.train_from_model`, what `sae-atlas train --from-model
   --transcode --skip` runs): one transcoder per layer reading `blocks.L.ln2.hook_normalized`
   and predicting `blocks.L.hook_mlp_out`, all 30 stepped on each batch of one forward; the
   `--atlas` is the atlas they are trained into (a finished set with the same configuration
   is reused, so a re-run only evaluates).
2. Per-layer held-out FVU, L0 and dead fraction (training.json: the blocks after the
   training blocks); CE loss and KL with all 30 MLPs replaced at once against the clean model
   and all 30 MLP outputs zero-ablated, on `--ce-blocks` blocks after the held-out blocks.
3. For each prompt: the attribution graph over the set (the dictionaries `Atlas.graph` of
   `--atlas` chooses: its transcoders, one per MLP) and over the residual-stream SAEs of
   `--residual-atlas`; replacement and completeness of the full and the pruned graph; the
   target's demeaned logit change when the graph's 5 most influential feature nodes are
   ablated vs 5 density-matched random active feature nodes (seeded). `Atlas.graph` itself
   is called last on the first prompt and its dictionaries and scores printed.
Training, held-out and CE tokens come from `--corpus` (default the built-in text, about
448k tokens; a longer run needs a local .jsonl / .txt / .parquet file or folder).
Target: pruned replacement >= 0.6 on the bench prompt. `--device cuda` runs the model, the
training and the graphs on the GPU; `--prompts N` keeps the first N prompts (0: no graphs, a
dry run's size).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import polars as pl
import torch
from safetensors.torch import load_file

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.graph import graph_saes
from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.node_interventions import (
    NodeEdit,
    density_matched,
    influence_ranked,
    intervene,
)
from sae_atlas.saes.circuits.prune import prune, scores
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.devices import use_by_default
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.streaming import special_ids
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.stream_source import plan_stream
from sae_atlas.saes.train.train_saes import HELDOUT_EVAL_TOKENS
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from sae_atlas.store.activations import excluded_positions

PROMPTS = (
    ("Let's do some days of the week math. Two days from Monday is", " Wednesday"),
    ("Monday, Tuesday, Wednesday, Thursday,", " Friday"),
    ("The capital of France is", " Paris"),
)


def train(handle: ModelHandle, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The 30 skip-transcoders from one streamed pass (reused when already trained)."""
    hooks = [f"blocks.{layer}.ln2.hook_normalized" for layer in range(handle.n_layers)]
    started = time.perf_counter()
    records = train_from_model(handle, args.atlas, hooks, architecture="topk", d_sae=args.d_sae, k=args.k,
                               sae_options={"skip": True}, transcode=True,
                               train_cfg=TrainConfig(total_tokens=args.tokens, batch_size=args.batch_size,
                                                     device=args.device),
                               stream=StreamOptions(corpus=CorpusSpec(source=args.corpus),
                                                    buffer_tokens=args.buffer_tokens))
    print(f"trained or reused {len(records)} transcoders in {time.perf_counter() - started:.0f} s", flush=True)
    return records


def heldout_token_batches(handle: ModelHandle, args: argparse.Namespace, skip: int):
    """`(token_ids, is_bos)` of `--ce-blocks` blocks after the first `skip` blocks, 4 at a time."""
    corpus = CorpusSpec(source=args.corpus)
    special = special_ids(handle)
    seen = 0
    for batch in iter_blocks(handle.tokenizer, corpus, max_blocks=skip + args.ce_blocks, batch_blocks=4):
        n, T = batch.token_ids.shape
        seen += n
        if seen <= skip:
            continue
        excluded = excluded_positions(batch.token_ids, torch.arange(T).expand(n, T), prepend_bos=True,
                                      special_ids=special)
        yield batch.token_ids.to(handle.device), excluded.to(handle.device)


def density_of(atlas: Atlas, sae_id: str) -> torch.Tensor:
    """Per-latent firing density: the summaries' when present, else the training's held-out
    density (sparsity.safetensors, log10)."""
    folder = atlas.sae(sae_id).folder
    if (folder / "features.parquet").exists():
        return torch.from_numpy(pl.read_parquet(folder / "features.parquet")["density"].to_numpy())
    return 10 ** load_file(folder / "sparsity.safetensors")["sparsity"]


def graph_row(atlas: Atlas, handle: ModelHandle, prompt: str, target: str, batch: int) -> dict[str, Any]:
    """One prompt's graph over the dictionaries the atlas's graphs use: scores and ablations."""
    views = [atlas.sae(s) for s in atlas.sae_ids]
    saes = graph_saes(atlas.ctx, views, chosen=False)
    started = time.perf_counter()
    g: Graph = build_graph(handle, saes, handle.to_tokens(prompt)[0], targets=[target], batch_size=batch)
    seconds = time.perf_counter() - started
    p = prune(g)
    kept = p.edge_mask & p.node_mask[:, None] & p.node_mask[None]
    full, pruned = scores(g), scores(g, g.adjacency * kept)
    dens = {sid: density_of(atlas, sid) for sid in g.dictionaries}

    def density(j: int) -> float:
        return float(dens[g.dictionaries[int(g.features.dictionary[j])]][int(g.features.latent[j])])

    top = influence_ranked(g)[:5]
    control = density_matched(g, top, density, seed=0)
    ablated = {name: intervene(handle, g, [NodeEdit("ablate", nodes)])
               for name, nodes in (("top5", top), ("random5", control))}
    return {"dictionaries": len(saes), "kind": g.kind, "features": g.n_features, "build_seconds": seconds,
            "replacement": full.replacement, "completeness": full.completeness,
            "pruned_replacement": pruned.replacement, "pruned_completeness": pruned.completeness,
            "kept_nodes": int(p.node_mask.sum()), "clean_logit": ablated["top5"].clean[0],
            "top5_change": ablated["top5"].measured[0], "random5_change": ablated["random5"].measured[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atlas", type=Path, required=True, help="atlas the set is trained into (a demo copy)")
    ap.add_argument("--residual-atlas", type=Path, default=Path("/tmp/democlone/atlas-demo"))
    ap.add_argument("--tokens", type=int, default=61440, help="training tokens of the streamed pass")
    ap.add_argument("--d-sae", type=int, default=2304)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--buffer-tokens", type=int, default=16384)
    ap.add_argument("--ce-blocks", type=int, default=8)
    ap.add_argument("--graph-batch", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--corpus", default="builtin", help="builtin, or a local .jsonl/.txt/.parquet file or folder")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the model, training, CE and graphs)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="graphs of the first N prompts (0: none)")
    args = ap.parse_args()
    device = str(use_by_default(args.device, None))  # what the atlas's dictionaries load on too
    handle = load_model("smollm2-135m", device=device)
    records = train(handle, args)
    result: dict[str, Any] = {"tokens": args.tokens, "d_sae": args.d_sae, "k": args.k, "corpus": args.corpus,
                              "per_layer": {}}
    for hook, r in sorted(records.items(), key=lambda kv: handle.hook_layer(kv[0])):
        result["per_layer"][handle.hook_layer(hook)] = {"sae_id": r["sae_id"], "fvu": r["fvu"], "l0": r["l0"],
                                                        "dead": r["dead_fraction"]}
    print("layer  held-out FVU  L0    dead")
    for layer, row in result["per_layer"].items():
        print(f"{layer:5d}  {row['fvu']:12.3f}  {row['l0']:4.1f}  {row['dead']:.1%}")

    atlas = Atlas(args.atlas)
    transcoders = [atlas.sae(r["sae_id"]).module() for r in records.values()]
    plan = plan_stream(handle, CorpusSpec(source=args.corpus), steps=args.tokens // args.batch_size, batch_size=args.batch_size,
                       batch_blocks=8, buffer_tokens=args.buffer_tokens, heldout_tokens=0, lanes=1)
    heldout = min(HELDOUT_EVAL_TOKENS, max(128, args.tokens // 10))  # train_from_model's default
    skip = plan.n_blocks + -(-heldout // 128)  # CE blocks after the held-out blocks
    ce = replacement_metrics(transcoders, handle.bridge, heldout_token_batches(handle, args, skip))
    result["all_replaced"] = {"ce_clean": ce["ce_loss_without_sae"], "ce_replaced": ce["ce_loss_with_sae"],
                              "ce_zero_ablated": ce["ce_loss_with_ablation"], "ce_recovered": ce["ce_loss_score"],
                              "kl_replaced": ce["kl_div_with_sae"], "kl_zero_ablated": ce["kl_div_with_ablation"],
                              "blocks": args.ce_blocks, "first_block": skip}
    a = result["all_replaced"]
    print(f"all 30 MLPs replaced ({args.ce_blocks} blocks from block {skip}): CE {a['ce_replaced']:.3f} vs clean "
          f"{a['ce_clean']:.3f}, zero-ablated {a['ce_zero_ablated']:.3f}; CE recovered {a['ce_recovered']:.3f}; "
          f"KL {a['kl_replaced']:.3f} (zero-ablated {a['kl_zero_ablated']:.3f})", flush=True)

    result["graphs"] = []
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    for prompt, target in PROMPTS[:args.prompts]:
        for name, where in (("transcoders", atlas), ("residual SAEs", Atlas(args.residual_atlas))):
            row = {"prompt": prompt, "target": target, "over": name,
                   **graph_row(where, handle, prompt, target, args.graph_batch)}
            result["graphs"].append(row)
            print(f"{prompt!r} -> {target!r} over {name} ({row['dictionaries']}, {row['features']} active features, "
                  f"{row['build_seconds']:.0f} s): replacement {row['replacement']:.3f} -> pruned "
                  f"{row['pruned_replacement']:.3f}; completeness {row['completeness']:.3f} -> "
                  f"{row['pruned_completeness']:.3f}; ablating the top 5 nodes moves the target logit "
                  f"{row['top5_change']:+.3f}, 5 density-matched random active features {row['random5_change']:+.3f} "
                  f"(clean {row['clean_logit']:.3f})", flush=True)
    if args.prompts:
        _atlas_graph(atlas, args, result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def _atlas_graph(atlas: Atlas, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """`Atlas.graph` itself on the first prompt: the dictionaries it chose and its scores."""
    view = atlas.graph(PROMPTS[0][0], targets=PROMPTS[0][1])
    print(f"Atlas.graph on {args.atlas}: {len(view.dictionaries)} dictionaries ({view.dictionaries[0]} ...), "
          f"replacement {view.scores['replacement']:.3f} (pruned {view.pruned_scores['replacement']:.3f})", flush=True)
    result["atlas_graph"] = {"dictionaries": view.dictionaries, "scores": view.scores,
                             "pruned_scores": view.pruned_scores}


if __name__ == "__main__":
    main()
