"""Streamed vs cached training of the same SAE: held-out FVU on the same unseen tokens.

    PYTHONPATH=. python bench/stream_equivalence.py [--tokens 61440] [--cache-tokens 73728] \
        [--corpus builtin|FILE.jsonl] [--work /tmp/trainbench/equiv] [--streamed-sae DIR] [--cached-sae DIR] \
        [--eval-chunks 8]

On the demo model's blocks.15.hook_resid_post, a TopK SAE of the demo's shape (4608
latents, k 32, batches of 4096, seed 0, the same `--tokens`) is trained twice:

- cached: `sae-atlas cache --tokens <cache-tokens>` (its train split should hold the training
  tokens, else the trainer repeats some; the cache is resumed if present; `--cache-tokens 0`
  takes `--cached-atlas`'s cache as it is), then `sae-atlas train` from that cache;
- streamed: `sae-atlas train --from-model` (mixing buffer `--buffer-tokens`), or the layer-15
  SAE of an earlier streamed run of the same configuration given with `--streamed-sae` (a
  multi-hook streamed run trains each SAE on the same batches as a one-hook run).

Both read the same `--corpus` (the built-in text holds about 448k tokens; a 1M-token run
needs a local .jsonl of natural text). Both are then evaluated on the same `--eval-tokens`
corpus tokens that neither saw: the
blocks after the cache's last block and after the stream's training blocks. Printed: both
FVUs, the relative gap |streamed - cached| / cached (target <= 3%), and each run's own
held-out FVU from its training.json. The evaluation tokens are also cut into `--eval-chunks`
consecutive chunks, and the signed gap (streamed - cached) / cached of each chunk is printed
with its range: how much of the whole gap is a property of the evaluation tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.models import load_model
from sae_atlas.saes.streaming import stream_activations
from sae_atlas.saes.train.reconstruction import reconstruction_stats
from sae_atlas.saes.train.stream_source import plan_stream
from sae_atlas.store.activations import ActivationReader

HOOK = "blocks.15.hook_resid_post"
D_SAE, K, BATCH = 4608, 32, 4096
SHAPE = ["--arch", "topk", "--d-sae", str(D_SAE), "--k", str(K), "--batch-size", str(BATCH), "--seed", "0",
         "--device", "cpu"]


def run(cmd: list[str], log: Path) -> None:
    """Run a CLI step, its output appended to `log`."""
    with log.open("a") as out:
        if subprocess.run([sys.executable, "-m", "sae_atlas", *cmd], stdout=out, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"sae-atlas {' '.join(cmd)} failed; see {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=61440)
    ap.add_argument("--cache-tokens", type=int, default=73728, help="0: use --cached-atlas's cache as it is")
    ap.add_argument("--buffer-tokens", type=int, default=262144, help="the stream's default")
    ap.add_argument("--eval-tokens", type=int, default=8192)
    ap.add_argument("--corpus", default="builtin", help="builtin, or a local .txt/.jsonl/.parquet file or folder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trainbench/equiv"))
    ap.add_argument("--cached-atlas", type=Path, default=None, help="default: <work>/cached")
    ap.add_argument("--streamed-sae", type=Path, default=None, help="layer-15 SAE of an earlier streamed run")
    ap.add_argument("--cached-sae", type=Path, default=None,
                    help="layer-15 SAE of an earlier cached run from --cached-atlas's cache (no caching or training)")
    ap.add_argument("--eval-chunks", type=int, default=8)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "steps.log"
    cached_atlas = args.cached_atlas or args.work / "cached"
    cached_sae = args.cached_sae
    if cached_sae is None:
        if args.cache_tokens:
            run(["cache", str(cached_atlas), "--hook", HOOK, "--tokens", str(args.cache_tokens), "--corpus",
                 args.corpus, "--device", "cpu"], log)
        run(["train", str(cached_atlas), "--hook", HOOK, "--tokens", str(args.tokens), *SHAPE], log)
        cached_sae = cached_atlas / "saes" / f"{HOOK}-topk-{D_SAE}"
    streamed_sae = args.streamed_sae
    if streamed_sae is None:
        streamed_atlas = args.work / "streamed"
        run(["train", str(streamed_atlas), "--from-model", "--hook", HOOK, "--tokens", str(args.tokens),
             "--corpus", args.corpus, "--buffer-tokens", str(args.buffer_tokens),
             "--heldout-tokens", str(args.eval_tokens), *SHAPE], log)
        streamed_sae = streamed_atlas / "saes" / f"{HOOK}-topk-{D_SAE}"
    records = {name: json.loads((folder / "training.json").read_text())
               for name, folder in (("cached", cached_sae), ("streamed", streamed_sae))}
    for name, record in records.items():
        wanted = {"total_tokens": args.tokens, "batch_size": BATCH, "seed": 0}
        got = {key: record["train_config"][key] for key in wanted}
        if got != wanted or record["sae_config"]["d_sae"] != D_SAE or record["sae_config"]["k"] != K:
            raise SystemExit(f"the {name} SAE was trained with {got}, not {wanted}")

    handle = load_model("smollm2-135m", device="cpu")
    corpus = CorpusSpec(source=args.corpus)
    cache_blocks = ActivationReader(cached_atlas, HOOK).n_blocks
    stream_blocks = plan_stream(handle, corpus, steps=args.tokens // BATCH, batch_size=BATCH, batch_blocks=8,
                                buffer_tokens=args.buffer_tokens, heldout_tokens=0, lanes=1).n_blocks
    start = max(cache_blocks, stream_blocks)
    n_eval = args.eval_tokens // corpus.context_size
    rows = []
    for batch in stream_activations(handle, corpus, [HOOK], n_blocks=start + n_eval, batch_blocks=8,
                                    resume_blocks=start, progress=False):
        rows.append(batch.acts[HOOK].reshape(-1, handle.d_model)[~batch.excluded.reshape(-1)])
    x = torch.cat(rows)
    saes = {name: load_saelens(folder) for name, folder in (("cached", cached_sae), ("streamed", streamed_sae))}
    fvu = {name: reconstruction_stats(sae, [x]).result()["fvu"] for name, sae in saes.items()}
    gap = abs(fvu["streamed"] - fvu["cached"]) / fvu["cached"]
    chunks = [[reconstruction_stats(sae, [part]).result()["fvu"] for sae in saes.values()]
              for part in x.tensor_split(args.eval_chunks)]
    chunk_gaps = sorted((streamed - cached) / cached for cached, streamed in chunks)
    print(f"{args.tokens:,} training tokens each; evaluated on {len(x):,} tokens of blocks {start}..{start + n_eval} "
          f"(cache ends at block {cache_blocks}, the stream's training blocks at {stream_blocks})")
    for name in ("cached", "streamed"):
        own = records[name]["heldout_metrics"]
        own_fvu = f"FVU {own['fvu']:.4f}" if "fvu" in own else "none held out"
        print(f"  {name:8s} FVU {fvu[name]:.4f} (its own held-out: {own_fvu} on {own['n_tokens']:,} "
              f"tokens; train FVU {records[name]['final_metrics']['fvu']:.4f})")
    print(f"relative gap |streamed - cached| / cached = {gap:.2%} (target <= 3%)")
    print(f"per chunk of {len(x) // args.eval_chunks:,} tokens: FVU cached / streamed "
          + ", ".join(f"{c:.4f}/{s:.4f}" for c, s in chunks)
          + f"; signed gap from {chunk_gaps[0]:+.2%} to {chunk_gaps[-1]:+.2%}, median "
          f"{chunk_gaps[len(chunk_gaps) // 2]:+.2%}")
    print(json.dumps({"tokens": args.tokens, "eval_tokens": len(x), "eval_start_block": start, "fvu": fvu,
                      "gap": gap, "chunks": chunks}))


if __name__ == "__main__":
    main()
