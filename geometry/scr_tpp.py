"""The maths layer of `scr_tpp`; its other layers: `sae_atlas.saes.eval.scr_tpp` (eval).

SAEBench's SCR and TPP scores (Karvonen et al. 2025, `evals/scr_and_tpp`) from pooled
activations, SAE codes and a decoder: the arithmetic only, no model.

A latent's effect on a probe is its class-mean code difference times the dot product of
the probe's direction with its decoder row. Ablating latents subtracts their decoded part
from the activations (the SAE's error term stays), which on mean-pooled texts equals
pooling the per-token ablation since decoding is linear.

- SCR (spurious correlation removal): a probe trained where a spurious attribute agrees
  with the label is biased; ablating the top-N latents of the spurious attribute's probe
  should raise its accuracy on the label toward that of a probe trained on clean data:
  `scr = (A_ablated - A_biased) / (A_clean - A_biased)`, in both directions (dir1 ablates
  the spurious attribute and scores the label, dir2 the reverse); `scr_metric` is the
  direction whose biased accuracy is lower (dir1 on a tie).
- TPP (targeted probe perturbation): per class, ablating the top-N latents of its
  one-vs-rest probe should drop that probe's accuracy (intended) and not the others'
  (unintended): `total = intended drop - mean unintended drop`, averaged over classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.probes import ProbeResult, logistic_probe

EffectMode = Literal["scr", "tpp"]
PROBE_TEST_FRAC = 0.1  # the probe's own held-out share of the training rows


@dataclass(frozen=True)
class Pooled:
    """Mean-pooled activations `[N, d]` and SAE codes `[N, F]` of the same texts."""

    acts: np.ndarray
    codes: np.ndarray

    def rows(self, index: np.ndarray) -> Pooled:
        """The rows at `index`."""
        return Pooled(self.acts[index], self.codes[index])


@dataclass(frozen=True)
class BinaryTask:
    """Rows of a split and their binary targets."""

    rows: np.ndarray
    y: np.ndarray


def fit_probe(acts_ND: np.ndarray, y_N: np.ndarray, seed: int) -> ProbeResult:
    """A logistic probe on activations (geometry.probes)."""
    return logistic_probe(acts_ND, y_N, test_frac=PROBE_TEST_FRAC, seed=seed)


def probe_accuracy(probe: ProbeResult, acts_ND: np.ndarray, y_N: np.ndarray) -> float:
    """Accuracy of `probe` on the rows `acts_ND` with binary targets `y_N`."""
    return float((((acts_ND @ probe.direction_D + probe.bias) > 0) == np.asarray(y_N, dtype=bool)).mean())


def latent_effects(codes_NF: np.ndarray, y_N: np.ndarray, direction_D: np.ndarray, W_dec_FD: np.ndarray,
                   mode: EffectMode) -> np.ndarray:
    """Each latent's effect on a probe: (mean code on positives - on negatives) x (decoder
    row . probe direction). `scr` takes its magnitude; `tpp` keeps only positive-class
    mean differences (clamped at 0), signed."""
    y = np.asarray(y_N, dtype=bool)
    diff_F = codes_NF[y].mean(0) - codes_NF[~y].mean(0)
    if mode == "tpp":
        diff_F = np.clip(diff_F, 0.0, None)
    effects_F = diff_F * (W_dec_FD @ direction_D)
    return np.abs(effects_F) if mode == "scr" else effects_F


def top_latents(effects_F: np.ndarray, n: int) -> np.ndarray:
    """The `n` latents of largest effect, among those with a nonzero one (fewer when fewer
    are nonzero; at most all of them)."""
    nonzero = np.flatnonzero(effects_F != 0)
    order = nonzero[np.argsort(-effects_F[nonzero], kind="stable")]
    return order[:n]


def ablate(pooled: Pooled, W_dec_FD: np.ndarray, latents: np.ndarray) -> np.ndarray:
    """The activations with the decoded contribution of `latents` removed."""
    return pooled.acts - pooled.codes[:, latents] @ W_dec_FD[latents]


def scr_score(ablated: float, biased: float, clean: float) -> float:
    """`(A_ablated - A_biased) / (A_clean - A_biased)`; 0 when the clean and biased
    accuracies are equal (nothing to recover)."""
    return 0.0 if clean == biased else (ablated - biased) / (clean - biased)


def scr_metrics(train: Pooled, test: Pooled, label_train: np.ndarray, spurious_train: np.ndarray,
                label_test: np.ndarray, spurious_test: np.ndarray, W_dec_FD: np.ndarray,
                n_values: tuple[int, ...], seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """SAEBench's SCR metrics of one dataset (`scr_dir1_threshold_{N}`,
    `scr_dir2_threshold_{N}`, `scr_metric_threshold_{N}`) and the probes' accuracies.
    The biased probe is trained on the training rows where label == spurious; the clean
    label and spurious probes on all training rows; every accuracy is on the test rows."""
    label_train, spurious_train = np.asarray(label_train, bool), np.asarray(spurious_train, bool)
    label_test, spurious_test = np.asarray(label_test, bool), np.asarray(spurious_test, bool)
    agree = label_train == spurious_train
    biased = fit_probe(train.acts[agree], label_train[agree], seed)
    targets = {"label": (label_train, label_test), "spurious": (spurious_train, spurious_test)}
    probes = {name: fit_probe(train.acts, y_train, seed) for name, (y_train, _) in targets.items()}
    accuracies = {f"clean_{name}": probe_accuracy(probes[name], test.acts, y_test)
                  for name, (_, y_test) in targets.items()}
    accuracies |= {f"biased_on_{name}": probe_accuracy(biased, test.acts, y_test)
                   for name, (_, y_test) in targets.items()}
    directions = {1: ("spurious", "label"), 2: ("label", "spurious")}  # (ablated probe, scored target)
    chosen = 1 if accuracies["biased_on_label"] <= accuracies["biased_on_spurious"] else 2
    metrics: dict[str, float] = {}
    for number, (ablated_name, scored_name) in directions.items():
        effects = latent_effects(train.codes, targets[ablated_name][0], probes[ablated_name].direction_D, W_dec_FD,
                                 "scr")
        for n in n_values:
            acts = ablate(test, W_dec_FD, top_latents(effects, n))
            score = scr_score(probe_accuracy(biased, acts, targets[scored_name][1]),
                              accuracies[f"biased_on_{scored_name}"], accuracies[f"clean_{scored_name}"])
            metrics[f"scr_dir{number}_threshold_{n}"] = score
            if number == chosen:
                metrics[f"scr_metric_threshold_{n}"] = score
    return metrics, accuracies


def tpp_metrics(train: Pooled, test: Pooled, train_tasks: dict[str, BinaryTask], test_tasks: dict[str, BinaryTask],
                W_dec_FD: np.ndarray, n_values: tuple[int, ...],
                seed: int) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """SAEBench's TPP metrics (`tpp_threshold_{N}_total_metric`, `_intended_diff_only`,
    `_unintended_diff_only`) averaged over classes, and per class. Each class has a
    one-vs-rest task on the training rows (its probe and latent effects) and on the test
    rows (every accuracy)."""
    if len(train_tasks) < 2 or set(train_tasks) != set(test_tasks):
        raise InvalidInputError("TPP needs the same two or more classes in the training and test tasks")
    probes = {cls: fit_probe(train.acts[task.rows], task.y, seed) for cls, task in train_tasks.items()}

    def accuracies(acts: np.ndarray) -> dict[str, float]:
        return {cls: probe_accuracy(probes[cls], acts[task.rows], task.y) for cls, task in test_tasks.items()}

    clean = accuracies(test.acts)
    per_class: dict[str, dict[str, float]] = {}
    for cls, task in train_tasks.items():
        effects = latent_effects(train.codes[task.rows], task.y, probes[cls].direction_D, W_dec_FD, "tpp")
        per_class[cls] = {}
        for n in n_values:
            ablated = accuracies(ablate(test, W_dec_FD, top_latents(effects, n)))
            intended = clean[cls] - ablated[cls]
            unintended = float(np.mean([clean[other] - ablated[other] for other in clean if other != cls]))
            per_class[cls] |= {f"tpp_threshold_{n}_total_metric": intended - unintended,
                               f"tpp_threshold_{n}_intended_diff_only": intended,
                               f"tpp_threshold_{n}_unintended_diff_only": unintended}
    keys = next(iter(per_class.values()))
    overall = {key: float(np.mean([scores[key] for scores in per_class.values()])) for key in keys}
    return overall, per_class
