"""`sae-atlas eval ATLAS`: run the evaluation suite on trained SAEs and write their results.

A thin call of `Atlas.eval` (the parameters: `api.operations.evals.EvalParams`). `--suite`
names the evals (default `core`, today's held-out metrics, also written to eval.json). Each
result goes to `saes/<id>/evals/<eval>.json` in SAEBench's layout; finished results are
kept, so a killed run restarts the rest.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    handle_errors,
    open_atlas,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.corpus_options import FROM_MODEL, context_option, corpus_option
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.api.results.suite import EvalsFailed, SuiteResults
from sae_atlas.saes.eval.names import DEFAULT_CE_BLOCKS, DEFAULT_TOKENS, EVAL_NAMES

DEFAULT_ATLAS = Path("atlas-demo")
COLUMNS = [
    ("l0", "L0"),
    ("explained_variance", "EV"),
    ("fvu", "FVU"),
    ("cossim", "cos"),
    ("relative_reconstruction_bias", "rel. bias"),
    ("dead_fraction", "dead"),
    ("dense_fraction", "dense"),
    ("ce_loss_score", "CE recovered"),
    ("kl_div_score", "KL score"),
]


def _cell(value: object) -> object:
    return "-" if value is None else value


def _print_results(atlas: Path, done: SuiteResults, json_out: bool) -> None:
    if json_out:
        print_json(done.to_dict())
        return
    if done.core:
        rows = [[sae_id, record["parameters"]["hook"], record["metrics"]["n_tokens"],
                 *(_cell(record["metrics"].get(key)) for key, _ in COLUMNS)] for sae_id, record in done.core.items()]
        print_table(f"SAE evaluation ({atlas})", ["SAE", "hook", "tokens", *(label for _, label in COLUMNS)], rows)
    for name in (name for name in done.suite if name != "core"):
        flat = {sae_id: {metric: value for category in results[name]["eval_result_metrics"].values()
                         for metric, value in category.items()}
                for sae_id, results in done.results.items() if name in results}
        metrics = sorted({metric for values in flat.values() for metric in values})
        print_table(f"{name} ({atlas})", ["SAE", *metrics],
                    [[sae_id, *(_cell(values.get(m)) for m in metrics)] for sae_id, values in flat.items()])


@handle_errors
def eval_command(
    atlas: Path = atlas_argument(DEFAULT_ATLAS),
    old_atlas: Path = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE id to evaluate (repeatable); default: every trained SAE."),
    suite: list[str] = typer.Option(["core"], help=f"Evals to run (comma-separated or repeated): "
                                    f"{', '.join(EVAL_NAMES)}."),
    tokens: int = typer.Option(DEFAULT_TOKENS, "--tokens", help="Held-out tokens for the activation metrics "
                               "(at least 1)."),
    ce_blocks: int = typer.Option(DEFAULT_CE_BLOCKS, help="Held-out blocks the model runs on for CE / KL "
                                  "(at least 1)."),
    no_model: bool = typer.Option(False, "--no-model", help="Skip the CE / KL metrics (no model forward passes)."),
    probe_data: Path = typer.Option(None, "--probe-data",
                                    help="sparse_probing: a .jsonl labelled set (a 'text' field and --label-field)."),
    label_field: str = typer.Option("label", help="sparse_probing: the label field of --probe-data."),
    probe_sets: list[str] = typer.Option([], "--probe-set",
                                         help="sparse_probing: a labelled set to probe (repeatable): topics, "
                                         "code_vs_prose (built in) or a SAEBench set by name, read from the hub, e.g. "
                                         "fancyzhx/ag_news. Default: the built-in sets."),
    per_class: int = typer.Option(None, "--per-class",
                                  help="sparse_probing: texts per class of each named set (default 32; at least 2)."),
    ground_truth: Path = typer.Option(None, "--ground-truth",
                                      help="ground_truth: a .safetensors planted dictionary with W_dec [n_atoms, d]."),
    autointerp_backend: str = typer.Option("lexical", help="autointerp: lexical (offline lexical proxy, no LLM), "
                                           "openai (an OpenAI-compatible chat endpoint; key in $SAE_ATLAS_AUTOINTERP_KEY) "
                                           "or hf (--autointerp-model run in-process)."),
    autointerp_url: str = typer.Option("", help="autointerp: the endpoint's base URL, e.g. http://127.0.0.1:8000/v1."),
    autointerp_model: str = typer.Option("", help="autointerp: the model name the endpoint serves (openai) or the "
                                         "model spec to load, e.g. smollm2-135m (hf)."),
    autointerp_latents: int = typer.Option(32, help="autointerp: latents explained and scored (seeded sample; at "
                                           "least 1)."),
    autointerp_negatives: str = typer.Option("random", help="autointerp: non-activating windows from random other "
                                             "latents, or 'similar' (hard negatives: the nearest latents by decoder "
                                             "cosine, in blocks where the latent never fires)."),
    force: bool = typer.Option(False, "--force", help="Recompute evals whose results are already finished."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    from_model: bool = typer.Option(False, "--from-model",
                                    help="core: activation metrics over --tokens corpus tokens streamed through the model."),
    corpus: str = corpus_option(FROM_MODEL),
    context: int = context_option(FROM_MODEL),
    batch_blocks: int = typer.Option(8, help=f"{FROM_MODEL}: blocks per forward pass (at least 1)."),
) -> None:
    """Evaluate SAEs: `core` (SAEBench metrics: EV, FVU, L0, dead/dense, CE recovered, KL score,
    BOS excluded), `sparse_probing`, `meta`, `mdl`, `ground_truth`, `autointerp`, `absorption`, `scr`, `tpp` (--suite).

    Results: saes/<id>/evals/<eval>.json (SAEBench layout) and, for core, eval.json.
    Finished results are kept (--force recomputes). Under `torchrun --nproc_per_node=R -m sae_atlas
    eval ...` the ranks take the (SAE, eval) jobs in turn and rank 0 prints; with
    --from-model the ranks first split the batches of the streamed `core` and rank 0 writes
    its merged metrics. --json prints {sae: eval.json} for core alone, else {sae: {eval: result}}.
    The options are `api.operations.evals.EvalParams`, checked there (as `Atlas.eval`)."""
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    root = the_atlas(atlas, old_atlas, DEFAULT_ATLAS)
    where = use_by_default(device, model_dtype)
    try:
        done = open_atlas(root).eval(
            saes, suite=suite, tokens=tokens, ce_blocks=ce_blocks, no_model=no_model, from_model=from_model,
            batch_blocks=batch_blocks, probe_data=probe_data, label_field=label_field, probe_sets=probe_sets,
            per_class=per_class, ground_truth=ground_truth, autointerp_backend=autointerp_backend,
            autointerp_url=autointerp_url, autointerp_model=autointerp_model, autointerp_latents=autointerp_latents,
            autointerp_negatives=autointerp_negatives, force=force,
            corpus=CorpusSpec(source=corpus, context_size=context), device=str(where))
    except EvalsFailed as failed:
        if failed.results is not None:
            _print_results(root, failed.results, json_out)
        raise
    if done is not None:
        _print_results(root, done, json_out)


def register(app: typer.Typer) -> None:
    """Add the `eval` verb."""
    app.command("eval")(eval_command)
