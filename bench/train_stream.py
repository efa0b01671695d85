"""Streamed training throughput and memory: `train --from-model` of the demo's three SAEs
against the bare stopped forward and the cached trainer, all measured in one run.

    PYTHONPATH=. python bench/train_stream.py [--atlas /tmp/democlone/atlas-demo] \
        [--stream-tokens 16384] [--rss-tokens 16384 --rss-tokens 65536] [--buffer-tokens 17408] \
        [--device cuda] [--hook blocks.2.hook_resid_post --rss-only]

In this process, on the demo model (SmolLM2-135M, stopped after the deepest hook) and the
demo's hooks (blocks.{8,15,22}.hook_resid_post), TopK SAEs of the demo's shape (4608
latents, k 32, batches of 4096, seed 0), per wall second and per CPU second of this process
(on a loaded shared machine the CPU seconds are the steadier measure):

- forward: the bare stopped forward's training rows (BOS and separators left out, as
  training leaves them out) over `--forward-tokens` corpus tokens, measured before and
  after the streamed run (their mean is used);
- train: the three SAEs stepped together by `train_dictionaries` from the demo's cache
  (`CachedSource`, nothing written);
- streamed: the same loop over a `StreamSource` (the model's forward, the mixing window,
  the steps: what `train --from-model` runs) for `--stream-tokens` tokens.

Printed: streamed / (1 / (1/forward + 1/train)) (target >= 0.9: the rate of forwarding and
then training with no overlap). Each `--rss-tokens` then runs `sae-atlas train --from-model`
of the three SAEs in a child process (fresh atlas under `--work`) and records its peak RSS
(`ru_maxrss`: model, buffer, SAEs and optimizer; target: flat in the token count). The
default buffer (17,408 tokens: 136 blocks keep ~17,000 rows on the builtin corpus, 4 whole
batches) makes every multiple of 16,384 tokens a whole number of windows. `--hook` (repeatable)
replaces the demo's three hooks (e.g. one shallow hook, so the forward stops early and a
million tokens take minutes); `--rss-only` skips the in-process rates (no cache needed);
`--device cuda` runs everything on the GPU (the peak RSS is then the host's share only).
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
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.loop import train_dictionaries
from sae_atlas.saes.train.sources import CachedSource
from sae_atlas.saes.train.stream_source import StreamSource
from sae_atlas.saes.train.train_saes import hook_seed
from sae_atlas.saes.train.trainer import SAEDictionary
from sae_atlas.store.activations import ActivationReader

HOOKS = ("blocks.8.hook_resid_post", "blocks.15.hook_resid_post", "blocks.22.hook_resid_post")
D_SAE, K, BATCH = 4608, 32, 4096


def _timed(fn) -> tuple[object, float, float]:
    """`fn()`, its wall seconds and this process's CPU seconds (all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def forward_rate(handle, hooks: tuple[str, ...], n_tokens: int, context: int) -> tuple[float, float]:
    """Training rows per wall and per CPU second of the bare forward over the hooks,
    stopped after the deepest."""
    def run() -> int:
        rows = sum(int((~b.excluded).sum()) for b in stream_activations(
            handle, CorpusSpec(context_size=context), hooks, n_blocks=n_tokens // context, batch_blocks=8,
            progress=False))
        _sync(str(handle.device))
        return rows
    rows, wall, cpu = _timed(run)
    return rows / wall, rows / cpu


def _dictionaries(hooks: tuple[str, ...], train: TrainConfig, device: str) -> list[SAEDictionary]:
    dictionaries = []
    for hook in hooks:
        cfg = SAEConfig("topk", 576, D_SAE, k=K, hook_name=hook, seed=hook_seed(0, hook))
        torch.manual_seed(0)
        dictionaries.append(SAEDictionary(cfg, train.resolve(576, D_SAE), device, name=hook))
    return dictionaries


def loop_rate(source, hooks: tuple[str, ...], n_tokens: int, device: str) -> tuple[float, float]:
    """Rows per wall and per CPU second of the SAEs stepped together from `source` (the
    whole `train_dictionaries` call: first batches, initialisation, every step)."""
    train = TrainConfig(total_tokens=n_tokens, batch_size=BATCH, seed=0, progress=False, checkpoint_every_tokens=0,
                        device=device)
    dictionaries = _dictionaries(hooks, train, device)

    def run() -> None:
        train_dictionaries(dictionaries, source)
        _sync(device)
    _, wall, cpu = _timed(run)
    return train.total_steps * BATCH / wall, train.total_steps * BATCH / cpu


def streamed_run(work: Path, hooks: tuple[str, ...], tokens: int, buffer_tokens: int, heldout_tokens: int,
                 device: str, corpus: str, d_sae: int = D_SAE) -> dict[str, float]:
    """`sae-atlas train --from-model` of the SAEs in a child process: its peak RSS (MiB),
    wall seconds, last reported forward share and the middle hook's held-out FVU."""
    atlas = work / f"stream-{tokens}"
    shutil.rmtree(atlas, ignore_errors=True)
    log = work / f"stream-{tokens}.log"
    cmd = [sys.executable, "-m", "sae_atlas", "train", str(atlas), "--from-model",
           *[a for hook in hooks for a in ("--hook", hook)], "--arch", "topk", "--d-sae", str(d_sae), "--k", str(K),
           "--tokens", str(tokens), "--batch-size", str(BATCH), "--seed", "0", "--buffer-tokens", str(buffer_tokens),
           "--heldout-tokens", str(heldout_tokens), "--device", device, "--corpus", corpus]
    started = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed; see {log}")
    middle = hooks[len(hooks) // 2]
    record = json.loads((atlas / "saes" / f"{middle}-topk-{d_sae}" / "training.json").read_text())
    final = record["final_metrics"]
    shares = re.findall(r"forward (\d+)%", log.read_text())
    return {"tokens": final["tokens"], "child_seconds": time.perf_counter() - started,
            "forward_share": int(shares[-1]) / 100 if shares else float("nan"),
            "peak_rss_mib": usage.ru_maxrss / 1024, "heldout_fvu": record["heldout_metrics"]["fvu"], "hook": middle}


def rates(args: argparse.Namespace, hooks: tuple[str, ...], context: int) -> dict[str, object]:
    """The bare forward, the cached trainer and the streamed trainer in this process, and
    streamed / (1 / (1/forward + 1/train)) per wall and per CPU second."""
    handle = load_model("smollm2-135m", device=args.device)
    before = forward_rate(handle, hooks, args.forward_tokens, context)
    print(f"bare stopped forward ({len(hooks)} hooks, to {hooks[-1]}): {before[0]:,.1f} rows/s, "
          f"{before[1]:,.1f} rows/CPU-s", flush=True)
    cached = CachedSource({hook: ActivationReader(args.atlas, hook) for hook in hooks}, BATCH, seed=0)
    train = loop_rate(cached, hooks, args.train_tokens, args.device)
    print(f"cached trainer ({len(hooks)} SAEs together): {train[0]:,.1f} rows/s, {train[1]:,.1f} rows/CPU-s",
          flush=True)
    steps = args.stream_tokens // BATCH
    source = StreamSource(handle, CorpusSpec(context_size=context), list(hooks), batch_size=BATCH, steps=steps,
                          buffer_tokens=args.buffer_tokens, seed=0)
    stream = loop_rate(source, hooks, steps * BATCH, args.device)
    print(f"streamed trainer ({len(hooks)} SAEs from the model, buffer {args.buffer_tokens:,}): {stream[0]:,.1f} "
          f"rows/s, {stream[1]:,.1f} rows/CPU-s, {source.forward_seconds / (steps * BATCH / stream[0]):.0%} of its "
          "wall time in the forward", flush=True)
    after = forward_rate(handle, hooks, args.forward_tokens, context)
    print(f"bare stopped forward again: {after[0]:,.1f} rows/s, {after[1]:,.1f} rows/CPU-s", flush=True)
    result: dict[str, object] = {"forward_before": before, "forward_after": after, "train": train, "stream": stream}
    for i, unit in enumerate(("wall", "CPU")):
        forward = (before[i] + after[i]) / 2
        serial = 1 / (1 / forward + 1 / train[i])
        result[f"ratio_{unit}"] = stream[i] / serial
        print(f"per {unit} second: forward {forward:,.1f} (mean of both), train {train[i]:,.1f}, "
              f"1/(1/forward + 1/train) = {serial:,.1f}; streamed {stream[i]:,.1f}: ratio {stream[i] / serial:.2f} "
              "(target >= 0.9)", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atlas", type=Path, default=Path("/tmp/democlone/atlas-demo"), help="the demo atlas (read)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trainbench/stream"))
    ap.add_argument("--hook", action="append", help="hooks of the SAEs (repeatable; default the demo's three)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--rss-only", action="store_true", help="only the --rss-tokens children (no in-process rates)")
    ap.add_argument("--rss-d-sae", type=int, default=D_SAE, help="latents of the --rss-tokens children's SAEs")
    ap.add_argument("--stream-tokens", type=int, default=16384, help="tokens of the in-process streamed run")
    ap.add_argument("--rss-tokens", type=int, action="append",
                    help="tokens of a `train --from-model` child whose peak RSS is recorded (repeatable)")
    ap.add_argument("--buffer-tokens", type=int, default=17408)
    ap.add_argument("--corpus", default="builtin", help="the children's corpus (the builtin one holds ~450k "
                    "tokens; a million need a local .jsonl/.txt)")
    ap.add_argument("--heldout-tokens", type=int, default=1024)
    ap.add_argument("--forward-tokens", type=int, default=2048)
    ap.add_argument("--train-tokens", type=int, default=16384, help="cached trainer's tokens")
    args = ap.parse_args()
    hooks = tuple(args.hook or HOOKS)
    args.work.mkdir(parents=True, exist_ok=True)
    context = json.loads((args.atlas / "atlas.json").read_text())["corpus"]["context_size"]
    result = {} if args.rss_only else rates(args, hooks, context)
    runs = []
    for n in args.rss_tokens or []:
        run = streamed_run(args.work, hooks, n, args.buffer_tokens, args.heldout_tokens, args.device, args.corpus,
                           args.rss_d_sae)
        runs.append(run)
        print(f"`train --from-model`, {run['tokens']:,} tokens: peak RSS {run['peak_rss_mib']:,.0f} MiB, "
              f"child {run['child_seconds']:.0f} s, held-out FVU {run['hook']} {run['heldout_fvu']:.4f}", flush=True)
    if len(runs) > 1:
        low, high = runs[0], runs[-1]
        print(f"peak RSS {low['peak_rss_mib']:,.0f} MiB at {low['tokens']:,} tokens vs {high['peak_rss_mib']:,.0f} MiB "
              f"at {high['tokens']:,} ({high['tokens'] / low['tokens']:.1f}x the tokens): "
              f"{high['peak_rss_mib'] / low['peak_rss_mib']:.3f}x")
    print(json.dumps({**result, "rss_runs": runs}))


if __name__ == "__main__":
    main()
