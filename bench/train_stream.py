"""Streamed training throughput and memory: `train --from-model` of the demo's three SAEs
against the bare stopped forward and the cached trainer, all measured in one run.

    PYTHONPATH=. python bench/train_stream.py [--atlas /tmp/democlone/atlas-demo] \
        [--work /tmp/trainbench/stream] [--tokens 16384 [--tokens 32768]] [--buffer-tokens 17408]

In this process, on the demo model (SmolLM2-135M, stopped after the deepest hook) and the
demo's hooks (blocks.{8,15,22}.hook_resid_post), TopK SAEs of the demo's shape (4608
latents, k 32, batches of 4096, seed 0):

- forward: the bare stopped forward's training rows per second (BOS and separators left
  out, as training leaves them out) over `--forward-tokens` corpus tokens;
- train: the cached trainer's rows per second, all three SAEs stepped together from the
  demo's cache (`train_dictionaries` over a `CachedSource`, nothing written);
- streamed: `sae-atlas train --from-model` of the three SAEs, once per `--tokens`, each in a
  child process (fresh atlas under `--work`); its rows per second are the training loop's
  (training.json's tokens / wall_seconds: streaming, mixing and stepping), and its peak RSS
  is the child's `ru_maxrss` (model, buffer, SAEs and optimizer included).

Printed: streamed / (1 / (1/forward + 1/train)) for each run (target >= 0.9, the rate of a
pipeline that first runs the forward and then trains on its rows, with no overlap) and the
peak RSS of each token count (target: flat in the token count). The default buffer (17,408
tokens: 136 blocks keep ~17,000 rows on the builtin corpus, 4 whole batches) makes each
`--tokens` a multiple of 16,384 a whole number of windows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.streaming import stream_activations
from sae_atlas.saes.train.atlas import hook_seed
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.loop import train_dictionaries
from sae_atlas.saes.train.sources import CachedSource
from sae_atlas.saes.train.trainer import SAEDictionary
from sae_atlas.store.activations import ActivationReader

HOOKS = ("blocks.8.hook_resid_post", "blocks.15.hook_resid_post", "blocks.22.hook_resid_post")
D_SAE, K, BATCH = 4608, 32, 4096


def forward_rate(handle, n_tokens: int, context: int) -> float:
    """Training rows per second of the bare forward over the three hooks, stopped after the deepest."""
    rows, started = 0, time.perf_counter()
    for batch in stream_activations(handle, CorpusSpec(context_size=context), HOOKS, n_blocks=n_tokens // context,
                                    batch_blocks=8, progress=False):
        rows += int((~batch.excluded).sum())
    return rows / (time.perf_counter() - started)


def trainer_rate(atlas: Path, n_tokens: int) -> float:
    """Rows per second of the three SAEs stepped together from the demo's cache."""
    train = TrainConfig(total_tokens=n_tokens, batch_size=BATCH, seed=0, progress=False, checkpoint_every_tokens=0)
    dictionaries = []
    for hook in HOOKS:
        cfg = SAEConfig("topk", 576, D_SAE, k=K, hook_name=hook, seed=hook_seed(0, hook))
        torch.manual_seed(0)
        dictionaries.append(SAEDictionary(cfg, train.resolve(576, D_SAE), "cpu", name=hook))
    source = CachedSource({hook: ActivationReader(atlas, hook) for hook in HOOKS}, BATCH, seed=0)
    run = train_dictionaries(dictionaries, source)
    return train.total_steps * BATCH / run.wall_seconds


def streamed_run(work: Path, tokens: int, buffer_tokens: int, heldout_tokens: int) -> dict[str, float]:
    """`sae-atlas train --from-model` of the three SAEs in a child process: the loop's rows
    per second, its last reported forward share and the child's peak RSS (MiB)."""
    atlas = work / f"stream-{tokens}"
    shutil.rmtree(atlas, ignore_errors=True)
    log = work / f"stream-{tokens}.log"
    cmd = [sys.executable, "-m", "sae_atlas", "train", "--from-model", "--atlas", str(atlas),
           *[a for hook in HOOKS for a in ("--hook", hook)], "--arch", "topk", "--d-sae", str(D_SAE), "--k", str(K),
           "--tokens", str(tokens), "--batch-size", str(BATCH), "--seed", "0", "--buffer-tokens", str(buffer_tokens),
           "--heldout-tokens", str(heldout_tokens), "--device", "cpu"]
    started = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed; see {log}")
    record = json.loads((atlas / "saes" / f"{HOOKS[1]}-topk-{D_SAE}" / "training.json").read_text())
    final = record["final_metrics"]
    shares = re.findall(r"forward (\d+)%", log.read_text())
    return {"tokens": final["tokens"], "rate": final["tokens"] / final["wall_seconds"],
            "loop_seconds": final["wall_seconds"], "child_seconds": time.perf_counter() - started,
            "forward_share": int(shares[-1]) / 100 if shares else float("nan"),
            "peak_rss_mib": usage.ru_maxrss / 1024, "heldout_fvu_l15": record["heldout_metrics"]["fvu"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atlas", type=Path, default=Path("/tmp/democlone/atlas-demo"), help="the demo atlas (read)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trainbench/stream"))
    ap.add_argument("--tokens", type=int, action="append", help="streamed runs' training tokens (repeatable)")
    ap.add_argument("--buffer-tokens", type=int, default=17408)
    ap.add_argument("--heldout-tokens", type=int, default=1024)
    ap.add_argument("--forward-tokens", type=int, default=2048)
    ap.add_argument("--train-tokens", type=int, default=16384, help="cached trainer's tokens")
    args = ap.parse_args()
    tokens = args.tokens or [16384]
    args.work.mkdir(parents=True, exist_ok=True)
    context = json.loads((args.atlas / "atlas.json").read_text())["corpus"]["context_size"]
    handle = load_model("smollm2-135m", device="cpu")
    forward = forward_rate(handle, args.forward_tokens, context)
    print(f"bare stopped forward (3 hooks, to layer 22): {forward:,.1f} rows/s", flush=True)
    train = trainer_rate(args.atlas, args.train_tokens)
    print(f"cached trainer (3 SAEs together): {train:,.1f} rows/s", flush=True)
    serial = 1 / (1 / forward + 1 / train)
    print(f"forward then train, no overlap: 1/(1/forward + 1/train) = {serial:,.1f} rows/s", flush=True)
    runs = []
    for n in tokens:
        run = streamed_run(args.work, n, args.buffer_tokens, args.heldout_tokens)
        runs.append(run)
        print(f"streamed {run['tokens']:,} tokens: {run['rate']:,.1f} rows/s in the loop "
              f"({run['loop_seconds']:.0f} s; child {run['child_seconds']:.0f} s with model load and held-out), "
              f"forward share {run['forward_share']:.0%}, ratio {run['rate'] / serial:.2f} (target >= 0.9), "
              f"peak RSS {run['peak_rss_mib']:,.0f} MiB, held-out FVU layer 15 {run['heldout_fvu_l15']:.4f}",
              flush=True)
    if len(runs) > 1:
        low, high = runs[0], runs[-1]
        print(f"peak RSS {low['peak_rss_mib']:,.0f} MiB at {low['tokens']:,} tokens vs {high['peak_rss_mib']:,.0f} MiB "
              f"at {high['tokens']:,} ({high['tokens'] / low['tokens']:.1f}x the tokens): "
              f"{high['peak_rss_mib'] / low['peak_rss_mib']:.3f}x")
    print(json.dumps({"forward": forward, "train": train, "serial": serial, "runs": runs}))


if __name__ == "__main__":
    main()
