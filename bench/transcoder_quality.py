"""Quality of an atlas's transcoders against MLP ablations, in one run.

    PYTHONPATH=. python bench/transcoder_quality.py --atlas /tmp/atlas-demo-tc \
        [--sae ID ...] [--tokens 8192] [--blocks 8] [--threads 1] [--out result.json]

For every transcoder of the atlas (or those named with `--sae`), on the held-out split of
its cached (input, output) pair:

- FVU of the MLP output it predicts (`saes.train.reconstruction`; predicting the mean is
  FVU 1, predicting zero is `E||y||^2 / sum_d Var(y_d)`, printed beside it), and its L0;
- the next-token CE loss on `--blocks` held-out blocks with that MLP replaced by the
  transcoder, against the clean model and the same MLP output zero-ablated and
  mean-ablated (mean over the cached train split), and CE recovered against each ablation:
  `(CE_ablated - CE_transcoder) / (CE_ablated - CE_clean)`;
- the same with every listed transcoder's MLP replaced at once.

BOS and separator positions keep the model's own MLP output and are left out of the
averages (`saes.eval.transcoder`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch

from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.eval.evaluate import _token_batches
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.paired_rows import PairedReader
from sae_atlas.saes.train.reconstruction import reconstruction_metrics
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.layout import AtlasLayout


def output_mean(root: Path, hook: str, max_tokens: int = 65536) -> torch.Tensor:
    """Mean `[d]` of a cached hook over (up to `max_tokens`) non-BOS tokens of its train split."""
    rows = torch.cat([r.acts for r in ActivationReader(root, hook).rows("train", max_tokens=max_tokens)])
    return rows.mean(0)


def zero_fvu(root: Path, hook: str, max_tokens: int) -> float:
    """FVU of predicting zeros for a hook's held-out rows: `E||y||^2 / sum_d Var(y_d)`."""
    y = torch.cat([r.acts for r in ActivationReader(root, hook).rows("heldout", max_tokens=max_tokens)]).double()
    return float(y.pow(2).sum(-1).mean() / (y - y.mean(0)).pow(2).sum(-1).mean())


def ce_rows(transcoders: list[SAE], handle: Any, reader: PairedReader, n_blocks: int,
            means: dict[str, torch.Tensor]) -> dict[str, Any]:
    """CE with `transcoders` spliced in against the clean model, zero and mean ablation."""
    zero = replacement_metrics(transcoders, handle.bridge, _token_batches(reader, n_blocks))
    mean = replacement_metrics(transcoders, handle.bridge, _token_batches(reader, n_blocks), ablation="mean",
                               means=means)
    return {"ce_clean": zero["ce_loss_without_sae"], "ce_transcoder": zero["ce_loss_with_sae"],
            "ce_zero_ablated": zero["ce_loss_with_ablation"], "ce_mean_ablated": mean["ce_loss_with_ablation"],
            "ce_recovered_vs_zero": zero["ce_loss_score"], "ce_recovered_vs_mean": mean["ce_loss_score"],
            "kl_transcoder": zero["kl_div_with_sae"], "kl_mean_ablated": mean["kl_div_with_ablation"],
            "n_positions": zero["n_ce_positions"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--atlas", type=Path, required=True)
    parser.add_argument("--sae", nargs="*", default=None, help="transcoder ids (default: every one)")
    parser.add_argument("--tokens", type=int, default=8192, help="held-out tokens for the FVU")
    parser.add_argument("--blocks", type=int, default=8, help="held-out blocks for CE")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layout = AtlasLayout(args.atlas)
    ids = args.sae or [sid for sid, r in (layout.read_meta().get("saes") or {}).items() if r.get("hook_out")]
    if not ids:
        raise SystemExit(f"no transcoders in {args.atlas}")
    saes = {sid: load_atlas_sae(args.atlas, sid) for sid in ids}
    handle = load_model(layout.read_meta()["model"])
    started = time.perf_counter()
    rows, means = {}, {}
    for sid, sae in saes.items():
        reader = PairedReader(args.atlas, sae.cfg.hook_name, sae.cfg.hook_name_out)
        means[sae.cfg.hook_name_out] = output_mean(args.atlas, sae.cfg.hook_name_out)
        recon = reconstruction_metrics(sae, (r.acts for r in reader.rows("heldout", max_tokens=args.tokens)))
        rows[sid] = {"hook": sae.cfg.hook_name, "hook_out": sae.cfg.hook_name_out, "d_sae": sae.cfg.d_sae,
                     "fvu": recon["fvu"], "fvu_zero_prediction": zero_fvu(args.atlas, sae.cfg.hook_name_out,
                                                                         args.tokens),
                     "l0": recon["l0"], "n_tokens": recon["n_tokens"],
                     **ce_rows([sae], handle, reader, args.blocks, {sae.cfg.hook_name_out: means[sae.cfg.hook_name_out]})}
        print(json.dumps({sid: rows[sid]}, indent=1), flush=True)
    first = next(iter(saes.values()))
    together = ce_rows(list(saes.values()), handle, PairedReader(args.atlas, first.cfg.hook_name,
                                                                 first.cfg.hook_name_out), args.blocks, means)
    result = {"per_transcoder": rows, "all_replaced": {"saes": ids, **together},
              "parameters": {"tokens": args.tokens, "blocks": args.blocks, "threads": args.threads},
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps({"all_replaced": result["all_replaced"]}, indent=1))
    for sid, row in itertools.chain(rows.items(), [("all", together)]):
        fvu = f"FVU {row['fvu']:.3f} (zero prediction {row['fvu_zero_prediction']:.2f}) " if "fvu" in row else ""
        print(f"{sid}: {fvu}CE clean {row['ce_clean']:.3f} transcoder {row['ce_transcoder']:.3f} "
              f"zero-abl {row['ce_zero_ablated']:.3f} mean-abl {row['ce_mean_ablated']:.3f} | recovered "
              f"{row['ce_recovered_vs_zero']:.3f} vs zero, {row['ce_recovered_vs_mean']:.3f} vs mean")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
