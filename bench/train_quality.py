"""SAE quality per training token: our trainer against SAELens, on the same batches.

    PYTHONPATH=. python bench/train_quality.py --data planted --budgets 262144 --seeds 0
    PYTHONPATH=. python bench/train_quality.py --data atlas:ATLAS:blocks.9.hook_resid_post ...

Both trainers get the same activations in the same order, batch 4096, TopK with the same
d_sae and k; each is scored on the same held-out tokens (`bench/sae_quality.py`: FVU,
L0, dead fraction) and, on planted data, by recovery of the true atoms. SAELens (not a
project dependency: it pins TransformerLens 3) runs in a throwaway venv made by this
script on first use (`--saelens-venv`; it reuses the project venv's torch through a
`.pth` file, so only SAELens' own packages are installed), through
`bench/saelens_train.py`. Prints tokens/s of each and the FVU ratio ours / SAELens.

Data: `planted` is a hard planted dictionary (`planted_dictionary`); `atlas:ROOT:HOOK`
reads cached residuals (`sae-atlas cache`) of one hook, training tokens from the train
split and held-out tokens from the eval split.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.sae_quality import heldout_metrics
from saes.sae.base import SAEConfig
from saes.train.config import TrainConfig
from saes.train.trainer import train_sae
from store.activations import ActivationReader

REPO = Path(__file__).resolve().parents[1]
SAELENS = "sae-lens==6.54.12"


def planted_dictionary(n_tokens: int, *, d_in: int = 384, n_atoms: int = 3000, active: float = 20.0,
                       alpha: float = 1.0, offset: float = 4.0, noise: float = 0.05,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`n_tokens` activations `offset_vector + sum_i m_i atom_i + noise` and the unit atoms.

    Atom i fires independently with probability proportional to (i + 1)^-alpha (a power
    law, ~`active` atoms per token on average, the most frequent at most 0.9), magnitudes
    0.5 + Exp(1); the offset vector has norm `offset`; noise is isotropic, `noise` per dim.
    Atoms and offset depend only on `seed`, so train and held-out draws share them.
    """
    gen = torch.Generator().manual_seed(seed)
    atoms_AD = torch.randn(n_atoms, d_in, generator=gen)
    atoms_AD /= atoms_AD.norm(dim=1, keepdim=True)
    offset_D = torch.randn(d_in, generator=gen)
    offset_D *= offset / offset_D.norm()
    freq_A = (torch.arange(n_atoms) + 1.0).pow(-alpha)
    freq_A = (freq_A * active / freq_A.sum()).clamp(max=0.9)
    out_ND = torch.empty(n_tokens, d_in)
    draws = torch.Generator().manual_seed(seed + 1 + n_tokens)
    for start in range(0, n_tokens, 4096):
        m = min(4096, n_tokens - start)
        on = torch.rand(m, n_atoms, generator=draws) < freq_A
        mags = on * (0.5 + torch.empty(m, n_atoms).exponential_(generator=draws))
        out_ND[start:start + m] = offset_D + mags @ atoms_AD + noise * torch.randn(m, d_in, generator=draws)
    return out_ND, atoms_AD


def atlas_tokens(root: str, hook: str, n_train: int, n_eval: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `n_train` shuffled train-split tokens and `n_eval` eval-split tokens (no BOS)."""
    reader = ActivationReader(root, hook)
    train = torch.cat(list(reader.batches(n_train, seed=seed)))[:n_train]  # one pass, one batch
    held = torch.cat(list(reader.batches(n_eval, seed=seed, split="eval")))[:n_eval]
    return train.float(), held.float()


def saelens_python(venv: Path) -> Path:
    """The python of a venv with SAELens, created on first use over the project's torch."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        ours = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "zz_project_packages.pth").write_text(ours + "\n")  # after its own packages
    if subprocess.run([str(python), "-c", "import sae_lens"], capture_output=True).returncode:
        subprocess.run([str(python), "-m", "pip", "install", "-q", SAELENS], check=True)
    return python


def run_ours(train_ND: torch.Tensor, eval_ND: torch.Tensor, d_sae: int, k: int, batch: int,
             seed: int) -> tuple[dict[str, float], torch.Tensor]:
    batches = list(train_ND.split(batch))
    cfg = TrainConfig(total_tokens=len(train_ND), batch_size=batch, seed=seed, progress=False,
                      checkpoint_every_tokens=0)
    start = time.perf_counter()
    result = train_sae(SAEConfig("topk", train_ND.shape[1], d_sae, k=k), batches, cfg)
    seconds = time.perf_counter() - start
    sae = result.sae.eval()
    metrics = heldout_metrics(sae.encode, sae.decode, eval_ND)
    metrics.update(seconds=seconds, tokens=cfg.total_steps * batch)
    return metrics, sae.W_dec.detach()


def run_saelens(python: Path, train_ND: torch.Tensor, eval_ND: torch.Tensor, d_sae: int, k: int, batch: int,
                seed: int) -> tuple[dict[str, float], torch.Tensor]:
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp, "data.safetensors"), Path(tmp, "out.json")
        save_file({"train": train_ND.contiguous(), "eval": eval_ND.contiguous()}, str(data))
        subprocess.run([str(python), str(REPO / "bench" / "saelens_train.py"), str(data), str(out),
                        "--d-sae", str(d_sae), "--k", str(k), "--batch", str(batch), "--seed", str(seed)],
                       check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                       stdout=subprocess.DEVNULL)
        return json.loads(out.read_text()), torch.load(str(out) + ".W_dec.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="planted", help="planted, or atlas:ROOT:HOOK")
    parser.add_argument("--budgets", default="262144", help="training tokens, comma-separated (e.g. 262144,1048576,4194304)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--eval-tokens", type=int, default=32768)
    parser.add_argument("--saelens-venv", default="/tmp/saelens-venv")
    args = parser.parse_args()
    python = saelens_python(Path(args.saelens_venv))
    print(f"data {args.data}, d_sae {args.d_sae}, k {args.k}, batch {args.batch}, "
          f"held-out {args.eval_tokens} tokens, torch threads {torch.get_num_threads()}")
    print("budget | seed | trainer | FVU | L0 | dead | recovery (mean cos / >0.9) | tokens/s")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for budget in [int(b) for b in args.budgets.split(",")]:
            atoms_AD = None
            if args.data == "planted":
                train_ND, atoms_AD = planted_dictionary(budget, seed=seed)
                eval_ND, _ = planted_dictionary(args.eval_tokens, seed=seed)
            else:
                _, root, hook = args.data.split(":", 2)
                train_ND, eval_ND = atlas_tokens(root, hook, budget, args.eval_tokens, seed)
            rows = {"ours": run_ours(train_ND, eval_ND, args.d_sae, args.k, args.batch, seed),
                    "saelens": run_saelens(python, train_ND, eval_ND, args.d_sae, args.k, args.batch, seed)}
            for name, (m, W_dec_FD) in rows.items():
                rec = "-"
                if atoms_AD is not None:
                    W = W_dec_FD / W_dec_FD.norm(dim=1, keepdim=True)
                    best_A = (atoms_AD @ W.T).max(dim=1).values
                    rec = f"{float(best_A.mean()):.3f} / {float((best_A > 0.9).float().mean()):.3f}"
                print(f"{budget} | {seed} | {name} | {m['fvu']:.4f} | {m['l0']:.1f} | {m['dead_fraction']:.3f} | "
                      f"{rec} | {m['tokens'] / m['seconds']:.0f}", flush=True)
            ours, theirs = rows["ours"][0], rows["saelens"][0]
            print(f"  FVU ours / SAELens = {ours['fvu'] / theirs['fvu']:.3f}; tokens/s ours / SAELens = "
                  f"{(ours['tokens'] / ours['seconds']) / (theirs['tokens'] / theirs['seconds']):.2f}x", flush=True)


if __name__ == "__main__":
    main()
