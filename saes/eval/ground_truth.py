"""`ground_truth`: how well the SAE's decoder recovers a planted dictionary.

For SAEs trained on synthetic activations built from known atoms (a file with
`W_dec [G, d]`), the decoder rows are matched to the atoms (`geometry.matching`): `mcc`,
the mean cosine of the Hungarian one-to-one matching (with `mcc_chance`, the same score of
a random dictionary of the SAE's shape), `mean_best_cosine` (for each atom, the best
cosine with any latent, averaged) and `frac_recovered` (share of atoms whose best cosine
exceeds `threshold`, 0.9 by default). Per-atom matches are the details.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.matching import RECOVERY_THRESHOLD, match_dictionaries
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.store.atomic import sha256_file

GROUND_TRUTH_KEY = "W_dec"


@dataclass(frozen=True)
class GroundTruthConfig:
    """The planted dictionary file, its sha256 (so a changed file is evaluated again), the
    recovery threshold and the seed of the chance-level dictionary."""

    path: str = ""
    sha256: str = ""
    threshold: float = RECOVERY_THRESHOLD
    seed: int = 0


def ground_truth_config(path: str | Path, *, threshold: float = RECOVERY_THRESHOLD, seed: int = 0) -> GroundTruthConfig:
    """The config for the planted dictionary at `path` (InvalidInputError if it is missing)."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"ground-truth dictionary {file} does not exist; pass a .safetensors file "
                                f"with {GROUND_TRUTH_KEY} [n_atoms, d]")
    return GroundTruthConfig(str(file.resolve()), sha256_file(file), threshold, seed)


def load_ground_truth(path: str | Path) -> np.ndarray:
    """`W_dec [G, d]` of a planted-dictionary file (InvalidInputError naming what is wrong)."""
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise InvalidInputError(f"cannot read the ground-truth dictionary {path}: {exc}") from exc
    if GROUND_TRUTH_KEY not in tensors:
        raise InvalidInputError(f"{path} has no {GROUND_TRUTH_KEY!r} tensor; it has: {', '.join(sorted(tensors))}")
    atoms = tensors[GROUND_TRUTH_KEY]
    if atoms.ndim != 2:
        raise InvalidInputError(f"{GROUND_TRUTH_KEY} in {path} must be [n_atoms, d], got shape {atoms.shape}")
    return atoms.astype(np.float64)


def run_ground_truth(inputs: EvalInputs, config: GroundTruthConfig) -> EvalOutcome:
    """Match the SAE's decoder rows to the planted atoms."""
    if not config.path:
        raise InvalidInputError("the ground_truth eval needs a planted dictionary: --ground-truth FILE.safetensors")
    atoms = load_ground_truth(config.path)
    decoder = inputs.sae.W_dec.detach().float().cpu().numpy()
    if atoms.shape[1] != decoder.shape[1]:
        raise InvalidInputError(f"the ground-truth atoms have d={atoms.shape[1]} but SAE {inputs.sae_id!r} "
                                f"has d_in={decoder.shape[1]}")
    match = match_dictionaries(decoder, atoms, threshold=config.threshold, seed=config.seed)
    metrics = {"mcc": match.mcc, "mcc_chance": match.mcc_chance, "mean_best_cosine": match.mean_best_cosine,
               "frac_recovered": match.frac_recovered, "n_atoms": int(atoms.shape[0])}
    details = [{"atom": atom, "latent": int(latent), "cosine": None if latent < 0 else float(cosine)}
               for atom, (latent, cosine) in enumerate(zip(match.matched_latent, match.matched_cosine, strict=True))]
    return EvalOutcome({"ground_truth": metrics}, details)


GROUND_TRUTH: EvalSpec[GroundTruthConfig] = EvalSpec("ground_truth", "ground_truth", GroundTruthConfig,
                                                     run_ground_truth)
