"""SAE quality per training token: our trainer against SAELens, on the same batches.

    PYTHONPATH=. python bench/train_quality.py --data planted --budgets 262144 --seeds 0
    PYTHONPATH=. python bench/train_quality.py --data atlas:ATLAS:blocks.9.hook_resid_post ...
    PYTHONPATH=. python bench/train_quality.py --budgets 1048576 --trainers ours \
        --variant "lr x3:lr=1.1e-3" --variant "no clip:grad_clip=0"

Both trainers get the same activations in the same order, batch 4096, TopK with the same
d_sae and k; each is scored on the same held-out tokens (`bench/sae_quality.py`: FVU,
L0, dead fraction) and, on planted data, by recovery of the true atoms. SAELens (not a
project dependency: it pins TransformerLens 3) runs in a throwaway venv made by this
script on first use (`--saelens-venv`; it reuses the project venv's torch through a
`.pth` file, so only SAELens' own packages are installed), through
`bench/saelens_train.py`. Prints tokens/s of each and the FVU ratio ours / SAELens.

`--variant NAME:FIELD=VALUE,...` adds a row of our trainer with those `TrainConfig` fields
changed (values are Python literals), so each candidate change is measured on the same
batches beside the defaults. SAELens results are kept in `--saelens-cache`, keyed by the
data's sha256 and the shape, so repeated experiments train SAELens once per setting.

Data: `planted` is a hard planted dictionary (`planted_dictionary`); `atlas:ROOT:HOOK`
reads cached residuals (`sae-atlas cache`) of one hook, training tokens from the train
split and held-out tokens from the held-out split. A budget larger than the cache's train
split needs `--max-passes P`: the split is then read up to P times, each later pass in a
fresh seeded shuffle, and the header says how many distinct tokens the run saw.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file, save_file

from bench.sae_quality import heldout_metrics
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.trainer import train_sae
from sae_atlas.store.activations import ActivationReader

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


def stored_planted(folder: Path, n_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`planted_dictionary(n_tokens, seed=seed)`, generated once and kept in `folder`."""
    path = folder / f"planted-{n_tokens}-{seed}.safetensors"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        data_ND, atoms_AD = planted_dictionary(n_tokens, seed=seed)
        save_file({"data": data_ND, "atoms": atoms_AD}, str(path) + ".tmp")
        Path(str(path) + ".tmp").rename(path)
    stored = load_file(str(path))
    return stored["data"], stored["atoms"]


class TrainingTokens(NamedTuple):
    """The training stream: distinct activations and the order they are read in."""

    rows_ND: torch.Tensor
    """Distinct training activations (float32)."""
    order_T: torch.Tensor | None
    """Row index of each training token, or None when the rows are read once, in order."""

    @property
    def n_tokens(self) -> int:
        return len(self.rows_ND) if self.order_T is None else len(self.order_T)

    def batches(self, batch: int) -> Iterator[torch.Tensor]:
        """The stream in batches of `batch` rows (a partial last batch is kept)."""
        for start in range(0, self.n_tokens, batch):
            if self.order_T is None:
                yield self.rows_ND[start:start + batch]
            else:
                yield self.rows_ND[self.order_T[start:start + batch]]


def atlas_tokens(root: str, hook: str, n_train: int, n_eval: int, seed: int,
                 max_passes: int = 1) -> tuple[TrainingTokens, torch.Tensor]:
    """`n_train` shuffled train-split tokens (up to `max_passes` reads of the split, each
    later pass reshuffled) and the first `n_eval` held-out tokens (no BOS)."""
    reader = ActivationReader(root, hook)
    rows_ND = _first_rows(reader.batches(4096, seed=seed), n_train)
    eval_ND = _first_rows(reader.batches(4096, seed=seed, split="heldout"), n_eval)
    if len(eval_ND) < n_eval:
        raise SystemExit(f"the cache holds {len(eval_ND)} held-out rows, fewer than the {n_eval} asked for")
    if len(rows_ND) == n_train:
        return TrainingTokens(rows_ND, None), eval_ND
    passes = -(-n_train // len(rows_ND))
    if passes > max_passes:
        raise SystemExit(f"the cache holds {len(rows_ND)} train rows; {n_train} tokens need {passes} passes "
                         f"over them (allowed: --max-passes {max_passes})")
    gen = torch.Generator().manual_seed(seed)
    order_T = torch.cat([torch.arange(len(rows_ND))]
                        + [torch.randperm(len(rows_ND), generator=gen) for _ in range(passes - 1)])
    return TrainingTokens(rows_ND, order_T[:n_train]), eval_ND


def _first_rows(batches: Iterator[torch.Tensor], n: int) -> torch.Tensor:
    """Up to the first `n` rows of a stream of batches, as one float32 tensor."""
    out_ND: torch.Tensor | None = None
    filled = 0
    for batch in batches:
        if out_ND is None:
            out_ND = torch.empty(n, batch.shape[1])
        take = min(len(batch), n - filled)
        out_ND[filled:filled + take] = batch[:take]
        filled += take
        if filled == n:
            return out_ND
    if out_ND is None:
        raise SystemExit("the cache holds no rows of that split")
    return out_ND[:filled].clone()


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


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME:FIELD=VALUE,...` as (name, {field: literal value}); fields must be TrainConfig's."""
    name, _, assignments = text.partition(":")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    changes = {}
    for item in filter(None, assignments.split(",")):
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--variant {text!r}: {key!r} is not a TrainConfig field ({', '.join(sorted(fields))})")
        changes[key] = ast.literal_eval(value)
    return name, changes


def run_ours(train: TrainingTokens, eval_ND: torch.Tensor, d_sae: int, k: int, batch: int,
             seed: int, changes: dict[str, Any] | None = None) -> tuple[dict[str, float], torch.Tensor]:
    cfg = TrainConfig(total_tokens=train.n_tokens, batch_size=batch, seed=seed, progress=False,
                      checkpoint_every_tokens=0, **(changes or {}))
    start = time.perf_counter()
    result = train_sae(SAEConfig("topk", train.rows_ND.shape[1], d_sae, k=k), train.batches(batch), cfg)
    seconds = time.perf_counter() - start
    sae = result.sae.eval()
    metrics = heldout_metrics(sae.encode, sae.decode, eval_ND)
    metrics.update(seconds=seconds, tokens=cfg.total_steps * batch)
    return metrics, sae.W_dec.detach()


def run_saelens(python: Path, train: TrainingTokens, eval_ND: torch.Tensor, d_sae: int, k: int, batch: int,
                seed: int, cache: Path) -> tuple[dict[str, float], torch.Tensor]:
    digest = hashlib.sha256()
    for tensor in (train.rows_ND, eval_ND) + (() if train.order_T is None else (train.order_T,)):
        digest.update(tensor.contiguous().numpy().tobytes())
    digest.update(f"{SAELENS} {d_sae} {k} {batch} {seed}".encode())
    stored = cache / f"{digest.hexdigest()[:24]}.json"
    if stored.exists():
        return json.loads(stored.read_text()), torch.load(str(stored) + ".W_dec.pt")
    cache.mkdir(parents=True, exist_ok=True)
    metrics, W_dec_FD = _train_saelens(python, train, eval_ND, d_sae, k, batch, seed)
    torch.save(W_dec_FD, str(stored) + ".W_dec.pt")
    stored.write_text(json.dumps(metrics))
    return metrics, W_dec_FD


def _train_saelens(python: Path, train: TrainingTokens, eval_ND: torch.Tensor, d_sae: int, k: int, batch: int,
                   seed: int) -> tuple[dict[str, float], torch.Tensor]:
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp, "data.safetensors"), Path(tmp, "out.json")
        tensors = {"train": train.rows_ND.contiguous(), "eval": eval_ND.contiguous()}
        if train.order_T is not None:
            tensors["order"] = train.order_T
        save_file(tensors, str(data))
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
    parser.add_argument("--max-passes", type=int, default=1,
                        help="reads of a cache's train split allowed to fill a budget (atlas data)")
    parser.add_argument("--saelens-venv", default="/tmp/saelens-venv")
    parser.add_argument("--saelens-cache", default="/tmp/saelens-results", help="folder of stored SAELens results")
    parser.add_argument("--data-cache", default="/tmp/train-quality-data", help="folder of generated planted data")
    parser.add_argument("--trainers", default="ours,saelens",
                        help="which of ours,saelens to run ('none': only the --variant rows)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:FIELD=VALUE,... an extra row of our trainer with TrainConfig changes")
    args = parser.parse_args()
    trainers = set(args.trainers.split(","))
    variants = ([("ours", {})] if "ours" in trainers else []) + [parse_variant(v) for v in args.variant]
    python = saelens_python(Path(args.saelens_venv)) if "saelens" in trainers else None
    print(f"data {args.data}, d_sae {args.d_sae}, k {args.k}, batch {args.batch}, "
          f"held-out {args.eval_tokens} tokens, torch threads {torch.get_num_threads()}")
    print("budget | seed | trainer | FVU | L0 | dead | recovery (mean cos / >0.9) | tokens/s")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for budget in [int(b) for b in args.budgets.split(",")]:
            atoms_AD = None
            if args.data == "planted":
                train_ND, atoms_AD = stored_planted(Path(args.data_cache), budget, seed)
                train = TrainingTokens(train_ND, None)
                eval_ND, _ = stored_planted(Path(args.data_cache), args.eval_tokens, seed)
            else:
                _, root, hook = args.data.split(":", 2)
                train, eval_ND = atlas_tokens(root, hook, budget, args.eval_tokens, seed, args.max_passes)
                if train.order_T is not None:
                    print(f"  budget {budget}: {len(train.rows_ND)} distinct tokens, "
                          f"read {budget / len(train.rows_ND):.2f} times", flush=True)
            rows = {name: run_ours(train, eval_ND, args.d_sae, args.k, args.batch, seed, changes)
                    for name, changes in variants}
            if python is not None:
                rows["saelens"] = run_saelens(python, train, eval_ND, args.d_sae, args.k, args.batch, seed,
                                              Path(args.saelens_cache))
            for name, (m, W_dec_FD) in rows.items():
                rec = "-"
                if atoms_AD is not None:
                    W = W_dec_FD / W_dec_FD.norm(dim=1, keepdim=True)
                    best_A = (atoms_AD @ W.T).max(dim=1).values
                    rec = f"{float(best_A.mean()):.3f} / {float((best_A > 0.9).float().mean()):.3f}"
                print(f"{budget} | {seed} | {name} | {m['fvu']:.4f} | {m['l0']:.1f} | {m['dead_fraction']:.3f} | "
                      f"{rec} | {m['tokens'] / m['seconds']:.0f}", flush=True)
            if "saelens" in rows:
                theirs = rows["saelens"][0]
                for name, _ in variants:
                    ours = rows[name][0]
                    print(f"  FVU {name} / SAELens = {ours['fvu'] / theirs['fvu']:.3f}; tokens/s {name} / SAELens = "
                          f"{(ours['tokens'] / ours['seconds']) / (theirs['tokens'] / theirs['seconds']):.2f}x",
                          flush=True)


if __name__ == "__main__":
    main()
