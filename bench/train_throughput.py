"""TopK SAE training throughput: our trainer step vs a naive dense step vs the GEMM roofline.

All three are measured in this process on the same shapes and data, interleaved over
several rounds (median per method), so machine load affects them alike:
- ours: `saes.train.trainer.optimizer_step` on the fast sparse TopK path (+ AuxK off);
- naive: the same step with the dense reference loss (`training_loss(fast=False)`:
  dense top-k scatter, dense `f @ W_dec`, dense backward through both);
- roofline: one `[B, d_in] x [d_in, d_sae]` matmul (the encoder GEMM), i.e. the cost of
  a step that did nothing but its single unavoidable dense product.

    PYTHONPATH=. python bench/train_throughput.py [--d-in 576 --d-sae 4608 --k 32 --batch 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.sae.losses import StepInfo
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.trainer import loss_module, make_optimizer, optimizer_step


class _Dense(torch.nn.Module):
    def __init__(self, sae):
        super().__init__()
        self.sae = sae

    def forward(self, x, info):
        out = self.sae.training_loss(x, info, fast=False)
        return out.loss, out.metrics, out.fired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-in", type=int, default=576)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per round and method")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = args.device
    cfg = TrainConfig(total_tokens=args.batch, batch_size=args.batch).resolve(args.d_in, args.d_sae)
    sae_cfg = SAEConfig("topk", args.d_in, args.d_sae, k=args.k)
    mean = torch.randn(args.d_in, device=dev)
    data = [mean + torch.randn(args.batch, args.d_in, device=dev) for _ in range(4)]
    info = StepInfo(total_steps=10**6, data_variance=float(args.d_in))

    runs = {}
    for name, wrap in (("ours", loss_module), ("naive", _Dense)):
        sae = build_sae(sae_cfg).to(dev)
        runs[name] = (wrap(sae), sae, make_optimizer(sae, cfg))
    W = runs["ours"][1].W_enc.detach().clone()
    out = torch.empty(args.batch, args.d_sae, device=dev)

    def sync() -> None:
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    def time_it(fn) -> tuple[float, float]:
        """Seconds per call: (wall clock, process CPU time over all threads)."""
        fn()  # warm-up
        sync()
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(args.steps):
            fn(i)
        sync()
        return (time.perf_counter() - wall) / args.steps, (time.process_time() - cpu) / args.steps

    def step(name: str):
        model, sae, opt = runs[name]
        return lambda i=0: optimizer_step(model, sae, opt, data[i % len(data)], info, cfg.grad_clip)

    gemm = lambda i=0: torch.mm(data[i % len(data)], W, out=out)  # noqa: E731
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "naive": [], "gemm": []}
    for _ in range(args.rounds):
        times["ours"].append(time_it(step("ours")))
        times["naive"].append(time_it(step("naive")))
        times["gemm"].append(time_it(gemm))
    print(f"shape: batch {args.batch}, d_in {args.d_in}, d_sae {args.d_sae}, k {args.k}, "
          f"device {dev}, threads {torch.get_num_threads()}, median of {args.rounds} rounds")
    for j, clock in enumerate(("wall clock", "process CPU time")):
        med = {name: statistics.median(t[j] for t in ts) for name, ts in times.items()}
        tps = {name: args.batch / v for name, v in med.items()}
        print(f"[{clock}]")
        print(f"  ours   step {med['ours'] * 1e3:8.1f} ms  {tps['ours']:9.0f} tokens/s")
        print(f"  naive  step {med['naive'] * 1e3:8.1f} ms  {tps['naive']:9.0f} tokens/s")
        print(f"  GEMM        {med['gemm'] * 1e3:8.1f} ms  {tps['gemm']:9.0f} tokens/s (roofline)")
        print(f"  ours / naive    = {tps['ours'] / tps['naive']:.2f}x   (target >= 4x)")
        print(f"  ours / roofline = {tps['ours'] / tps['gemm']:.0%}   (target >= 50%)")


if __name__ == "__main__":
    main()
