"""Our side of the SAEBench cross-check and the comparison, metric by metric.

Our numbers come from the project's own eval code on the fixture's model, SAE and inputs
(`saes.eval.evaluate.evaluate_sae`, `saes.eval.downstream.downstream_metrics` and
`saes.eval.core.core_outcome` for core; `saes.eval.sparse_probing.run_sparse_probing` for
sparse probing). Each SAEBench metric maps to exactly one of ours (`core.CATEGORIES`
gives the core names; sparse-probing names are SAEBench's own) and is checked one of three
ways (`Check.relation`):

- `same`: the same definition on the same tokens; SAEBench's value must equal ours within
  `SAME_RTOL` relative (float32 forward passes in two implementations, TransformerLens 3's
  own GPT-NeoX against TransformerLens 4 wrapping Hugging Face's, and float32 against
  float64 accumulation; observed differences are ~1e-6).
- `convention`: a documented difference of definition. SAEBench's value must equal the
  value recomputed from our inputs under SAEBench's convention, within `SAME_RTOL`, which
  shows the difference is that convention and nothing else. The conventions:
  `explained_variance` divides by `E||x||^2 - (E||x||^2 / d)^2` (SAEBench's variance
  term; ours divides by `sum_d Var(x_d)`), `mse` is `E||x - x_hat||^2 / n_tokens` (ours is
  per element, `/ d`), zero ablation also zeroes the BOS position (ours keeps BOS clean in
  both patched runs), KL also counts each block's last position (ours scores the CE
  positions), and token counts count every position of the batches (ours: those scored).
- `statistical`: probe accuracies. Both sides pool the same activations (checked to
  `SAME_RTOL` on SAEBench's recorded pooled vectors) but probe different random train /
  test samples (SAEBench: its fixed train and test texts, negatives drawn from the other
  classes; ours: a seeded 75/25 split of all texts of a balanced one-vs-rest task), with
  different fits for the full-width probe (SAEBench: AdamW, 100 epochs, the best epoch
  chosen on the test set; ours: L2 logistic regression on standardised inputs). The
  tolerance is three standard errors of the difference of two independent held-out
  accuracy estimates, averaged over the tasks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from bench.saebench.inputs import FIXTURE, HOOK
from sae_atlas.saes.eval.core import CATEGORIES, core_outcome
from sae_atlas.saes.eval.downstream import downstream_metrics
from sae_atlas.saes.eval.evaluate import evaluate_sae
from sae_atlas.saes.eval.sparse_probing import (
    SparseProbingConfig,
    binary_tasks,
    pooled_activations,
    probe_sets,
    run_sparse_probing,
    with_probe_file,
)
from sae_atlas.saes.eval.spec import EvalInputs
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.hook_fns import replace_hook
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.sae.base import SAE

Relation = Literal["same", "convention", "statistical"]
SAME_RTOL = 1e-4
SIGMAS = 3.0
K_VALUES = (1, 2, 5)


class Check(NamedTuple):
    """One SAEBench metric against ours: SAEBench's value, ours, the value SAEBench's must
    match (ours, or ours recomputed under SAEBench's convention) and the allowed gap."""

    metric: str  # "<category>.<SAEBench name>"
    ours_name: str  # our metric it maps to
    relation: Relation
    saebench: float
    ours: float
    expected: float
    tolerance: float  # absolute

    @property
    def gap(self) -> float:
        return abs(self.saebench - self.expected)

    @property
    def ok(self) -> bool:
        return self.gap <= self.tolerance


def _close(metric: str, ours_name: str, saebench: float, ours: float, expected: float | None = None,
          relation: Relation = "same") -> Check:
    target = ours if expected is None else expected
    return Check(metric, ours_name, relation, float(saebench), float(ours), float(target),
                 SAME_RTOL * max(abs(saebench), abs(target), 1e-12))


@dataclass
class Fixture:
    """The shared inputs and SAEBench's outputs, loaded once."""

    folder: Path
    handle: ModelHandle
    sae: SAE
    saebench_core: dict[str, Any]
    saebench_sparse_probing: dict[str, Any]
    saebench_pooled: dict[str, np.ndarray]

    @classmethod
    def load(cls, folder: Path = FIXTURE) -> Fixture:
        with np.load(folder / "saebench_pooled.npz") as pooled:
            arrays = {key: pooled[key] for key in pooled.files}
        return cls(folder, load_model(str(folder / "model"), cache=False), load_saelens(folder / "sae"),
                   json.loads((folder / "saebench_core.json").read_text()),
                   json.loads((folder / "saebench_sparse_probing.json").read_text()), arrays)

    def probe_rows(self) -> list[dict[str, str]]:
        """The labelled texts: text, label and SAEBench's split."""
        return [json.loads(line) for line in (self.folder / "probe_texts.jsonl").read_text().splitlines()]

    def core_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(token_ids [B, T], is_bos [B, T])` of the core blocks."""
        tokens_BT = torch.tensor(json.loads((self.folder / "core_tokens.json").read_text()))
        return tokens_BT, tokens_BT == self.handle.bos_token_id


def saebench_downstream(fx: Fixture) -> dict[str, float]:
    """CE and KL under SAEBench's conventions, from our model and SAE: the SAE run keeps
    BOS clean (as ours), the ablation run zeroes every position including BOS, CE is
    averaged over positions whose input is not BOS, KL over every non-BOS position
    including each block's last."""
    tokens_BT, is_bos_BT = fx.core_tokens()
    bridge = fx.handle.bridge

    def sae_fill(act: torch.Tensor) -> torch.Tensor:
        return torch.where(is_bos_BT[..., None], act, fx.sae(act).x_hat)

    with torch.inference_mode():
        logits = {"clean": bridge(tokens_BT),
                  "sae": bridge.run_with_hooks(tokens_BT, fwd_hooks=[(HOOK, replace_hook(sae_fill))]),
                  "zero": bridge.run_with_hooks(tokens_BT, fwd_hooks=[(HOOK, replace_hook(torch.zeros_like))])}
    logp = {run: value.double().log_softmax(-1) for run, value in logits.items()}
    scored = ~is_bos_BT
    ce_positions = scored[:, :-1]
    out = {}
    for run, name in (("clean", "ce_loss_without_sae"), ("sae", "ce_loss_with_sae"), ("zero", "ce_loss_with_ablation")):
        ce_BT = -logp[run][:, :-1].gather(-1, tokens_BT[:, 1:, None]).squeeze(-1)
        out[name] = float(ce_BT[ce_positions].mean())
    for run, name in (("sae", "kl_div_with_sae"), ("zero", "kl_div_with_ablation")):
        kl_BT = (logp["clean"].exp() * (logp["clean"] - logp[run])).sum(-1)
        out[name] = float(kl_BT[scored].mean())
    out["ce_loss_score"] = ((out["ce_loss_with_ablation"] - out["ce_loss_with_sae"])
                            / (out["ce_loss_with_ablation"] - out["ce_loss_without_sae"]))
    out["kl_div_score"] = (out["kl_div_with_ablation"] - out["kl_div_with_sae"]) / out["kl_div_with_ablation"]
    return out


def our_core(fx: Fixture) -> tuple[dict[str, dict[str, Any]], dict[str, Any], torch.Tensor]:
    """Our core metrics in SAEBench's categories, the flat metric record, and the non-BOS
    activation rows `[n, d]` they were computed on."""
    tokens_BT, is_bos_BT = fx.core_tokens()
    rows_ND = run_hooks(fx.handle, tokens_BT, [HOOK])[HOOK][~is_bos_BT]
    metrics = evaluate_sae(fx.sae, [rows_ND], n_tokens=len(rows_ND))
    metrics.update(downstream_metrics(fx.sae, fx.handle.bridge, HOOK, [(tokens_BT, is_bos_BT)]))
    return core_outcome({"metrics": metrics, "parameters": {}}).metrics, metrics, rows_ND


CORE_SAME = ("sparsity.l0", "sparsity.l1", "reconstruction_quality.cossim", "shrinkage.l2_norm_in",
             "shrinkage.l2_norm_out", "shrinkage.l2_ratio", "shrinkage.relative_reconstruction_bias",
             "model_performance_preservation.ce_loss_without_sae", "model_performance_preservation.ce_loss_with_sae",
             "misc_metrics.frac_alive", "misc_metrics.freq_over_10_percent")
CORE_DOWNSTREAM_CONVENTION = ("model_performance_preservation.ce_loss_with_ablation",
                              "model_performance_preservation.ce_loss_score",
                              "model_behavior_preservation.kl_div_with_sae",
                              "model_behavior_preservation.kl_div_with_ablation",
                              "model_behavior_preservation.kl_div_score")


def core_checks(fx: Fixture) -> list[Check]:
    """Every SAEBench core metric that one of ours maps to, checked."""
    ours, flat, rows_ND = our_core(fx)
    theirs = fx.saebench_core["eval_result_metrics"]

    def pair(key: str) -> tuple[float, float, str]:
        category, name = key.split(".")
        ours_name = CATEGORIES.get(category, {}).get(name, "1 - dead_fraction" if name == "frac_alive" else name)
        return theirs[category][name], ours[category][name], ours_name

    checks = [_close(key, ours_name, saebench, value) for key in CORE_SAME
              for saebench, value, ours_name in [pair(key)]]
    convention = saebench_downstream(fx)
    checks += [_close(key, ours_name, saebench, value, convention[key.split(".")[1]], "convention")
               for key in CORE_DOWNSTREAM_CONVENTION for saebench, value, ours_name in [pair(key)]]
    rows64 = rows_ND.double()
    d, n = rows64.shape[1], rows64.shape[0]
    sse_per_token = flat["mse"] * d
    sum_sq = float(rows64.pow(2).sum(-1).mean())
    ev = 1.0 - sse_per_token / (sum_sq - (sum_sq / d) ** 2)
    saebench_ev, ours_ev, _ = pair("reconstruction_quality.explained_variance")
    checks.append(_close("reconstruction_quality.explained_variance", "explained_variance", saebench_ev, ours_ev, ev,
                        "convention"))
    saebench_mse, ours_mse, _ = pair("reconstruction_quality.mse")
    checks.append(_close("reconstruction_quality.mse", "mse", saebench_mse, ours_mse, sse_per_token / n, "convention"))
    tokens_BT, _ = fx.core_tokens()
    for name in ("total_tokens_eval_reconstruction", "total_tokens_eval_sparsity_variance"):
        saebench_count, ours_count, ours_name = pair(f"token_stats.{name}")
        checks.append(_close(f"token_stats.{name}", ours_name, saebench_count, ours_count, tokens_BT.numel(),
                            "convention"))
    return checks


class FixtureInputs(EvalInputs):
    """`EvalInputs` over the fixture's SAE and model instead of an atlas's."""

    def __init__(self, fx: Fixture) -> None:
        super().__init__(atlas=fx.folder, sae_id="sae", device="cpu", model=lambda: fx.handle)
        self.__dict__["sae"] = fx.sae  # the cached SAE: the fixture's, not an atlas's


def probe_config(fx: Fixture) -> SparseProbingConfig:
    """Our sparse-probing config over the fixture's labelled texts (no built-in sets)."""
    return with_probe_file(SparseProbingConfig(datasets=(), k_values=K_VALUES), fx.folder / "probe_texts.jsonl",
                           "label")


def pooled_check(fx: Fixture) -> Check:
    """Our mean-pooled activations and SAE codes of the texts SAEBench recorded against its
    own: the largest difference relative to the largest magnitude."""
    texts: dict[str, list[str]] = {}
    for row in fx.probe_rows():
        if row["split"] == "test":
            texts.setdefault(row["label"], []).append(row["text"])
    per_class = len(fx.saebench_pooled["llm"]) // len(fx.saebench_pooled["labels"])
    chosen = [t for label in fx.saebench_pooled["labels"] for t in texts[str(label)][:per_class]]
    acts, codes = pooled_activations(fx.handle, fx.sae, HOOK, chosen, max_tokens=probe_config(fx).max_tokens)
    theirs = np.concatenate([fx.saebench_pooled["llm"], fx.saebench_pooled["sae"]], 1)
    ours = np.concatenate([acts, codes], 1)
    scale = float(np.abs(theirs).max())
    gap = float(np.abs(theirs - ours).max())
    return Check("pooled.max_relative_difference", "pooled_activations", "same", gap / scale,
                 0.0, 0.0, SAME_RTOL)


def accuracy_tolerance(accuracy: float, n_saebench: int, n_ours: int, tasks: int) -> float:
    """SIGMAS standard errors of the difference of two independent held-out accuracies of
    `tasks` tasks each, with `n_saebench` and `n_ours` test rows per task."""
    p = min(max(accuracy, 0.05), 0.95)  # a floor for the variance of accuracies near 0 or 1
    return SIGMAS * math.sqrt(p * (1 - p) * (1 / n_saebench + 1 / n_ours) / tasks)


def sparse_probing_checks(fx: Fixture) -> list[Check]:
    """The pooled-input check and every SAEBench sparse-probing accuracy against ours."""
    config = probe_config(fx)
    ours = run_sparse_probing(FixtureInputs(fx), config).metrics
    theirs = fx.saebench_sparse_probing["eval_result_metrics"]
    probe_set = probe_sets(config)[0]
    tasks = binary_tasks(probe_set.labels, config.seed)
    n_ours = round(np.mean([len(rows) for _, rows, _ in tasks]) * config.test_frac)
    test_labels = [row["label"] for row in fx.probe_rows() if row["split"] == "test"]
    n_saebench = 2 * round(len(test_labels) / len(set(test_labels)))  # positives + as many negatives
    checks = [pooled_check(fx)]
    for basis in ("llm", "sae"):
        for name in [f"{basis}_test_accuracy"] + [f"{basis}_top_{k}_test_accuracy" for k in K_VALUES]:
            saebench, value = theirs[basis][name], ours[basis][name]
            checks.append(Check(f"{basis}.{name}", name, "statistical", saebench, value, value,
                                accuracy_tolerance((saebench + value) / 2, n_saebench, n_ours, len(tasks))))
    return checks


def table(checks: list[Check]) -> str:
    """A markdown table of the checks."""
    lines = ["| SAEBench metric | ours | relation | SAEBench | ours | expected | gap | tolerance | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c.metric} | {c.ours_name} | {c.relation} | {c.saebench:.6g} | {c.ours:.6g} | {c.expected:.6g} | "
              f"{c.gap:.2g} | {c.tolerance:.2g} | {'yes' if c.ok else 'NO'} |" for c in checks]
    return "\n".join(lines)


def main(folder: Path = FIXTURE) -> list[Check]:
    """Compare and print; returns the checks."""
    torch.set_num_threads(2)
    fx = Fixture.load(folder)
    checks = core_checks(fx) + sparse_probing_checks(fx)
    print(table(checks))
    failed = [c.metric for c in checks if not c.ok]
    print(f"\n{len(checks) - len(failed)}/{len(checks)} within tolerance" + (f"; outside: {failed}" if failed else ""))
    return checks


if __name__ == "__main__":
    main()
