"""`sparse_probing`: can a handful of SAE latents classify what the texts are about?

SAEBench's sparse probing (Karvonen et al. 2025; after Gurnee et al. 2023, "Finding
Neurons in a Haystack"): every text's hook activations and SAE codes are mean-pooled over
its non-BOS tokens (first `max_tokens` tokens); each class of a labelled set becomes a
one-vs-rest task, balanced by seeded subsampling of the larger side (a two-class set is
one task). Per task, on a seeded held-out split (`geometry.probes.sparse_probing_accuracies`): a
logistic probe on the full residual (`llm_test_accuracy`), on all latents
(`sae_test_accuracy`), and k-sparse probes on the top-k units by class-mean difference
(`llm_top_{k}_test_accuracy`, `sae_top_{k}_test_accuracy`, k in `k_values`). Accuracies are
averaged over the tasks of a set (`eval_result_details`, one row per set) and then over
sets (`eval_result_metrics`, categories `llm` and `sae`); per-task scores are unstructured.
The sets are `saes.eval.probe_data`'s: the built-in ones and an optional `.jsonl` file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.probes import sparse_probing_accuracies
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.encoding.texts import pool_tokens, tokenize_texts
from sae_atlas.saes.eval.probe_data import (
    BUILTIN_PROBE_SETS,
    ProbeSet,
    file_probe_set,
    named_probe_set,
    probe_set_names,
    unknown_probe_set,
)
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.atomic import sha256_file


@dataclass(frozen=True)
class SparseProbingConfig:
    """The built-in sets, an optional `.jsonl` set (its path, sha256 and fields), the k of
    the sparse probes, texts per class of a built-in set, tokens per text, the held-out
    share and the seed."""

    datasets: tuple[str, ...] = BUILTIN_PROBE_SETS
    probe_file: str = ""
    probe_file_sha256: str = ""
    label_field: str = "label"
    text_field: str = "text"
    k_values: tuple[int, ...] = (1, 2, 5)
    per_class: int = 32
    max_tokens: int = 64
    test_frac: float = 0.25
    seed: int = 0


def with_probe_file(config: SparseProbingConfig, path: str | Path, label_field: str,
                    text_field: str = "text") -> SparseProbingConfig:
    """`config` with a user `.jsonl` set added, checked now (InvalidInputError naming the
    file when it lacks labels or has fewer than two classes)."""
    file_probe_set(path, label_field, text_field)
    return replace(config, probe_file=str(Path(path).resolve()), probe_file_sha256=sha256_file(path),
                   label_field=label_field, text_field=text_field)


def with_datasets(config: SparseProbingConfig, names: list[str], per_class: int | None = None) -> SparseProbingConfig:
    """`config` probing the named sets (built-in or SAEBench's hub sets; checked now) with
    `per_class` texts per class when given."""
    for name in names:
        if name not in probe_set_names():
            raise unknown_probe_set(name)
    return replace(config, datasets=tuple(names), per_class=per_class or config.per_class)


def probe_sets(config: SparseProbingConfig) -> list[ProbeSet]:
    """The labelled sets the config names, built-in first."""
    sets = [named_probe_set(name, config.per_class, config.seed) for name in config.datasets]
    if config.probe_file:
        sets.append(file_probe_set(config.probe_file, config.label_field, config.text_field))
    if not sets:
        raise InvalidInputError("sparse probing needs at least one labelled set")
    return sets


@torch.no_grad()
def pooled_activations(handle: ModelHandle, sae: SAE, hook: str, texts: list[str], *, max_tokens: int,
                       batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """`(activations [N, d], codes [N, d_sae])` of `texts` at `hook`, each mean-pooled over
    the text's first `max_tokens` tokens after BOS (texts need at least one such token)."""
    tokens, lengths = tokenize_texts(handle, texts)
    lengths = lengths.clamp(max=max_tokens + 1)
    if int(lengths.min()) < 2:
        raise InvalidInputError("every probe text needs at least one token after BOS")
    acts, codes = [], []
    for start in range(0, len(texts), batch_size):
        sl = slice(start, start + batch_size)
        width = int(lengths[sl].max())
        x = run_hooks(handle, tokens[sl, :width], [hook])[hook][:, 1:]
        inner = lengths[sl] - 1
        acts.append(pool_tokens(x.float(), inner, "mean").cpu().numpy())
        codes.append(pool_tokens(sae_codes(sae, x), inner, "mean").float().cpu().numpy())
    return np.concatenate(acts), np.concatenate(codes)


def binary_tasks(labels: list[str], seed: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """`(class, rows, targets)` per one-vs-rest task, balanced: the larger side subsampled
    (seeded) to the smaller one's count; one task for a two-class set."""
    labels_N = np.asarray(labels)
    classes = sorted(set(labels))
    rng = np.random.default_rng(seed)
    tasks = []
    for cls in classes[1:] if len(classes) == 2 else classes:
        positive, negative = np.flatnonzero(labels_N == cls), np.flatnonzero(labels_N != cls)
        size = min(len(positive), len(negative))
        rows = np.concatenate([rng.choice(positive, size=size, replace=False),
                               rng.choice(negative, size=size, replace=False)])
        tasks.append((cls, rows, labels_N[rows] == cls))
    return tasks


def set_scores(acts: np.ndarray, codes: np.ndarray, probe_set: ProbeSet,
               config: SparseProbingConfig) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The task-averaged accuracies of one set and the per-task ones."""
    per_task = {cls: sparse_probing_accuracies({"llm": acts[rows], "sae": codes[rows]}, y, config.k_values,
                                               test_frac=config.test_frac, seed=config.seed)
                for cls, rows, y in binary_tasks(probe_set.labels, config.seed)}
    keys = next(iter(per_task.values()))
    return {key: float(np.mean([scores[key] for scores in per_task.values()])) for key in keys}, per_task


def run_sparse_probing(inputs: EvalInputs, config: SparseProbingConfig) -> EvalOutcome:
    """Pool the model's activations and the SAE's codes over every labelled text and probe."""
    handle, hook = inputs.checked_model()
    details: list[dict[str, Any]] = []
    unstructured: dict[str, Any] = {}
    for probe_set in probe_sets(config):
        acts, codes = pooled_activations(handle, inputs.sae, hook, probe_set.texts, max_tokens=config.max_tokens)
        averaged, per_task = set_scores(acts, codes, probe_set, config)
        details.append({"dataset_name": probe_set.name, **averaged})
        unstructured[probe_set.name] = per_task
    keys = [key for key in details[0] if key != "dataset_name"]
    overall = {key: float(np.mean([row[key] for row in details])) for key in keys}
    metrics = {basis: {key: value for key, value in overall.items() if key.startswith(f"{basis}_")}
               for basis in ("llm", "sae")}
    return EvalOutcome(metrics, details, unstructured)


SPARSE_PROBING: EvalSpec[SparseProbingConfig] = EvalSpec("sparse_probing", "sparse_probing", SparseProbingConfig,
                                                          run_sparse_probing)
