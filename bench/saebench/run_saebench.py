"""SAEBench's own core and sparse-probing evals on the shared inputs (run in SAEBench's venv).

Run with the throwaway venv's Python (`python -m bench.saebench` sets it up and calls this
file by path, from a directory outside any git repository, so SAEBench's commit field
reads "Unknown" rather than this project's commit):
`<venv>/bin/python /path/to/bench/saebench/run_saebench.py <fixture dir>`. It imports
nothing from sae-atlas. SAEBench only loads hub models and datasets, so the inputs are
handed to its functions here:

- the model: the fixture's GPT-NeoX folder as a TransformerLens 3 `HookedTransformer`
  (config from the local folder, weights converted unprocessed, as
  `from_pretrained_no_processing` does for hub names);
- the SAE: the fixture's SAELens folder through `SAE.load_from_disk` and SAEBench's
  `load_and_format_sae`;
- core: `run_evals` on an object with the `ActivationsStore` methods it calls, serving the
  fixture's token blocks; metrics and JSON as `multiple_evals` builds them
  (`calculate_misc_metrics`, `save_single_eval_result`), with
  `exclude_special_tokens_from_reconstruction` and BOS / EOS / PAD ignored, as SAEBench's
  documented runs use;
- sparse probing: SAEBench's `run_eval` with its dataset loader returning the fixture's
  labelled texts (its own train / test split) and its model loader returning the model.
  The per-text mean-pooled activations and SAE codes its probes read are recorded for
  the first `POOLED_PER_CLASS` test texts of each class (`saebench_pooled.npz`).

Writes `saebench_core.json`, `saebench_sparse_probing.json` (SAEBench's output files, as
its code writes them) and `saebench_pooled.npz` into the fixture directory.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

DATASET = "sae_atlas/crosscheck_topics"
RELEASE = "sae_atlas_crosscheck"
POOLED_PER_CLASS = 8


def load_model(folder: Path):
    """The fixture's GPT-NeoX as an unprocessed TransformerLens 3 HookedTransformer."""
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as loading
    from transformer_lens.pretrained.weight_conversions import convert_neox_weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = loading.get_pretrained_model_config(str(folder), hf_cfg=hf_model.config.to_dict(), device="cpu",
                                              dtype=torch.float32)
    model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="right")
    model.load_and_process_state_dict(convert_neox_weights(hf_model, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


def load_sae(folder: Path):
    """The fixture's SAE as SAELens reads it, prepared the way SAEBench prepares custom SAEs."""
    from sae_bench.sae_bench_utils import general_utils
    from sae_lens import SAE

    sae = SAE.load_from_disk(str(folder), device="cpu")
    _, sae, _ = general_utils.load_and_format_sae(RELEASE, sae, "cpu")
    return sae.to(device="cpu", dtype=torch.float32)


class TokenStore:
    """The parts of SAELens' `ActivationsStore` that SAEBench's `run_evals` calls, serving
    fixed token blocks in order (`reset_input_dataset` starts again from the first)."""

    def __init__(self, tokens_BT: torch.Tensor) -> None:
        self.tokens_BT = tokens_BT
        self.context_size = tokens_BT.shape[1]
        self.store_batch_size_prompts = tokens_BT.shape[0]
        self.position = 0

    def get_batch_tokens(self, batch_size: int) -> torch.Tensor:
        batch = self.tokens_BT[self.position:self.position + batch_size]
        if len(batch) != batch_size:
            raise ValueError(f"only {len(self.tokens_BT)} token blocks, asked for more")
        self.position += batch_size
        return batch

    def reset_input_dataset(self) -> None:
        self.position = 0


def run_core(fixture: Path, model, sae, out: Path) -> None:
    """SAEBench's core eval over the fixture's token blocks, one batch of all blocks."""
    from sae_bench.evals.core import main as core
    from sae_bench.evals.core.eval_config import CoreEvalConfig
    from sae_bench.sae_bench_utils import get_eval_uuid, get_sae_bench_version, get_sae_lens_version

    tokens_BT = torch.tensor(json.loads((fixture / "core_tokens.json").read_text()))
    config = CoreEvalConfig(
        model_name=sae.cfg.metadata.model_name, llm_dtype="float32", batch_size_prompts=len(tokens_BT),
        n_eval_reconstruction_batches=1, n_eval_sparsity_variance_batches=1, dataset="core_tokens.json",
        context_size=tokens_BT.shape[1], compute_kl=True, compute_ce_loss=True, compute_l2_norms=True,
        compute_sparsity_metrics=True, compute_variance_metrics=True,
        compute_featurewise_density_statistics=True, compute_featurewise_weight_based_metrics=True,
        exclude_special_tokens_from_reconstruction=True)
    tok = model.tokenizer
    metrics, feature_metrics = core.run_evals(
        sae=sae, activation_store=TokenStore(tokens_BT), model=model, eval_config=config,
        ignore_tokens={tok.pad_token_id, tok.eos_token_id, tok.bos_token_id})
    metrics["misc_metrics"] = core.calculate_misc_metrics(feature_metrics)
    result = core.replace_nans_with_negative_one({
        "unique_id": f"{RELEASE}_custom_sae", "sae_set": RELEASE, "sae_id": "custom_sae", "eval_cfg": config,
        "metrics": metrics, "feature_metrics": feature_metrics})
    core.save_single_eval_result(result, get_eval_uuid(), get_sae_lens_version(), get_sae_bench_version(),
                                 str(out), sae)


def probe_texts(fixture: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """`(train, test)`: the fixture's texts per label, as SAEBench's dataset loaders return them."""
    split: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    for line in (fixture / "probe_texts.jsonl").read_text().splitlines():
        row = json.loads(line)
        split[row["split"]].setdefault(row["label"], []).append(row["text"])
    return split["train"], split["test"]


def run_sparse_probing(fixture: Path, model, sae, out: Path) -> dict[str, np.ndarray]:
    """SAEBench's sparse-probing eval on the fixture's texts; returns the pooled
    activations and codes of the first test texts of each class."""
    from sae_bench.evals.sparse_probing import main as sparse_probing
    from sae_bench.evals.sparse_probing.eval_config import SparseProbingEvalConfig
    from sae_bench.sae_bench_utils import activation_collection, dataset_info, dataset_utils

    train, test = probe_texts(fixture)
    dataset_info.chosen_classes_per_dataset[DATASET] = list(train)
    dataset_utils.get_multi_label_train_test_data = lambda *args, **kwargs: (train, test)

    class LocalModel:
        @staticmethod
        def from_pretrained_no_processing(*args, **kwargs):
            return model

    sparse_probing.HookedTransformer = LocalModel
    seen: dict[str, list[dict[str, torch.Tensor]]] = {"llm": [], "sae": []}
    pool_llm, pool_sae = activation_collection.create_meaned_model_activations, \
        activation_collection.get_sae_meaned_activations

    def spy_llm(acts):
        seen["llm"].append(pooled := pool_llm(acts))
        return pooled

    def spy_sae(acts, sae_, batch_size):
        seen["sae"].append(pooled := pool_sae(acts, sae_, batch_size))
        return pooled

    activation_collection.create_meaned_model_activations = spy_llm
    activation_collection.get_sae_meaned_activations = spy_sae
    n_train = sum(len(v) for v in train.values())
    n_test = sum(len(v) for v in test.values())
    config = SparseProbingEvalConfig(model_name=sae.cfg.metadata.model_name, dataset_names=[DATASET],
                                     probe_train_set_size=n_train, probe_test_set_size=n_test, context_length=32,
                                     llm_batch_size=64, llm_dtype="float32", k_values=[1, 2, 5])
    with tempfile.TemporaryDirectory() as scratch:
        results = sparse_probing.run_eval(config, [(RELEASE, sae)], "cpu", scratch, force_rerun=True,
                                          clean_up_activations=True, save_activations=False,
                                          artifacts_path=str(Path(scratch) / "artifacts"))
        written = next(Path(scratch).glob("*_eval_results.json"))
        shutil.copyfile(written, out)
    if len(results) != 1 or len(seen["llm"]) != 2 or len(seen["sae"]) != 2:
        raise AssertionError("SAEBench pooled an unexpected number of activation sets")
    labels = list(test)
    return {"labels": np.array(labels),
            "llm": np.concatenate([seen["llm"][1][c][:POOLED_PER_CLASS].numpy() for c in labels]),
            "sae": np.concatenate([seen["sae"][1][c][:POOLED_PER_CLASS].numpy() for c in labels])}


def main(fixture: Path) -> None:
    torch.set_num_threads(2)
    model = load_model(fixture / "model")
    sae = load_sae(fixture / "sae")
    run_core(fixture, model, sae, fixture / "saebench_core.json")
    pooled = run_sparse_probing(fixture, model, sae, fixture / "saebench_sparse_probing.json")
    np.savez_compressed(fixture / "saebench_pooled.npz", **pooled)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
