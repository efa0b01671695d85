"""Train a SAELens TopK SAE on saved activations (run by `bench/train_quality.py` with the
python of a venv that has `sae-lens`; not importable in the project venv).

    python bench/saelens_train.py DATA.safetensors OUT.json --d-sae 4608 --k 32 --batch 4096

DATA holds `train` (consumed in order, in batches; or in the row order given by `order`
when present) and `eval`. Inputs are scaled so that
E||x||^2 = d_in (the scale estimated from the first 8 batches, as our trainer does) and
`b_dec` starts at the mean of those batches; everything else is SAELens' default.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.config import SAETrainerConfig
from safetensors.torch import load_file

from bench.sae_quality import heldout_metrics

SCALE_BATCHES = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--d-sae", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = load_file(args.data)
    train_ND, eval_ND = data["train"].float(), data["eval"].float()
    order_T = data.get("order", torch.arange(len(train_ND)))
    n_batches = len(order_T) // args.batch
    first = train_ND[order_T[:SCALE_BATCHES * args.batch]]
    scale = (train_ND.shape[1] / first.pow(2).sum(1).mean()).sqrt()
    batches = (train_ND[order_T[i * args.batch:(i + 1) * args.batch]] * scale for i in range(n_batches))
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=train_ND.shape[1], d_sae=args.d_sae, k=args.k))
    with torch.no_grad():
        sae.b_dec.copy_((first * scale).mean(0))
    lr = SAETrainerConfig.lr  # SAELens' default (3e-4), constant; lr_end is what its runner would set
    trainer = SAETrainer(SAETrainerConfig(total_training_samples=n_batches * args.batch,
                                          train_batch_size_samples=args.batch, lr=lr, lr_end=lr / 10),
                         sae, batches)
    start = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - start
    sae.eval()
    metrics = heldout_metrics(sae.encode, sae.decode, eval_ND * scale)
    metrics.update(seconds=seconds, tokens=n_batches * args.batch)
    torch.save(sae.W_dec.detach().clone(), args.out + ".W_dec.pt")
    with open(args.out, "w") as f:
        json.dump(metrics, f)


if __name__ == "__main__":
    main()
