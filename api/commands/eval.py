"""`sae-atlas eval`: run the evaluation suite on trained SAEs and write their results.

`--suite` names the evals (`saes.eval.suite.EVALS`; default `core`, today's held-out
metrics, also written to eval.json). Each result goes to `saes/<id>/evals/<eval>.json` in
SAEBench's layout; finished results are kept, so a killed run restarts the rest.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sae_atlas.api.commands.common import handle_errors, print_json, print_table
from sae_atlas.api.commands.corpus_options import (
    FROM_MODEL,
    batch_blocks_option,
    context_option,
    corpus_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.saes.eval.names import DEFAULT_CE_BLOCKS, DEFAULT_TOKENS, EVAL_NAMES, EvalName
from sae_atlas.store.errors import AtlasError, InvalidInputError
from sae_atlas.store.layout import AtlasLayout

if TYPE_CHECKING:
    from sae_atlas.saes.eval.core import CoreConfig
    from sae_atlas.saes.models import ModelHandle

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
NEEDS_MODEL: tuple[EvalName, ...] = ("sparse_probing",)


def _cell(value: object) -> object:
    return "-" if value is None else value


class EvalsFailed(AtlasError):
    """Some evals of the suite failed (the others' results were written)."""


def _configs(names: list[EvalName], *, tokens: int, ce_blocks: int, no_model: bool, from_model: bool,
             probe_data: Path | None, label_field: str, probe_sets: list[str], per_class: int | None,
             ground_truth: Path | None, autointerp: dict[str, Any]) -> dict[EvalName, Any]:
    """Each named eval's config from the options, checked before anything runs."""
    from sae_atlas.saes.eval.autointerp import autointerp_config
    from sae_atlas.saes.eval.core import CoreConfig
    from sae_atlas.saes.eval.ground_truth import ground_truth_config
    from sae_atlas.saes.eval.sparse_probing import (
        SparseProbingConfig,
        with_datasets,
        with_probe_file,
    )
    from sae_atlas.saes.eval.sparse_probing import probe_sets as probe_sets_of

    if no_model and (needing := [n for n in names if n in NEEDS_MODEL]):
        raise InvalidInputError(f"--suite {','.join(needing)} runs the model; drop --no-model")
    if "ground_truth" in names and ground_truth is None:
        raise InvalidInputError("--suite ground_truth needs --ground-truth FILE.safetensors (W_dec [n_atoms, d])")
    configs: dict[EvalName, Any] = {
        "core": CoreConfig(tokens, ce_blocks, not (no_model or from_model), "stream" if from_model else "heldout"),
    }
    if "sparse_probing" in names:
        sparse = SparseProbingConfig()
        if probe_sets or per_class:
            sparse = with_datasets(sparse, probe_sets or list(sparse.datasets), per_class)
            probe_sets_of(sparse)  # read now: a hub set that cannot be read stops the run before any SAE
        configs["sparse_probing"] = sparse if probe_data is None else with_probe_file(sparse, probe_data, label_field)
    if ground_truth is not None:
        configs["ground_truth"] = ground_truth_config(ground_truth)
    if "autointerp" in names:
        configs["autointerp"] = autointerp_config(**autointerp)
    return configs


def _core_from_model(atlas: Path, ids: list[str], config: CoreConfig, *, tokens: int, corpus: str, context: int,
                     batch_blocks: int, where: Any, ctx: Any) -> dict[str, dict[str, Any]] | None:
    """`core` over corpus tokens streamed through the model (every torchrun rank takes part;
    rank 0 writes eval.json and the core results); None on the other ranks. Always
    recomputed: the ranks share one pass over the tokens for all SAEs."""
    import time

    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.eval.core import CORE, core_outcome
    from sae_atlas.saes.eval.results import write_result
    from sae_atlas.saes.eval.stream import evaluate_from_model
    from sae_atlas.saes.models import load_model

    handle = load_model(AtlasLayout(atlas).read_meta()["model"], device=ctx.device(str(where)) if ctx else where)
    started = time.perf_counter()
    records = evaluate_from_model(handle, atlas, ids, corpus=CorpusSpec(source=corpus, context_size=context),
                                  n_tokens=tokens, batch_blocks=batch_blocks, ctx=ctx)
    if ctx is not None and not ctx.is_main:
        return None
    for sae_id, record in records.items():
        write_result(atlas, sae_id, CORE, config, core_outcome(record), time.perf_counter() - started)
    return records


def _print_results(atlas: Path, names: list[EvalName], core: dict[str, dict[str, Any]],
                   evals: dict[str, dict[EvalName, dict[str, Any]]], json_out: bool) -> None:
    others = [name for name in names if name != "core"]
    if json_out:
        print_json(core if not others else evals)
        return
    if core:
        rows = [[sae_id, record["parameters"]["hook"], record["metrics"]["n_tokens"],
                 *(_cell(record["metrics"].get(key)) for key, _ in COLUMNS)] for sae_id, record in core.items()]
        print_table(f"SAE evaluation ({atlas})", ["SAE", "hook", "tokens", *(label for _, label in COLUMNS)], rows)
    for name in others:
        flat = {sae_id: {metric: value for category in results[name]["eval_result_metrics"].values()
                         for metric, value in category.items()}
                for sae_id, results in evals.items() if name in results}
        metrics = sorted({metric for values in flat.values() for metric in values})
        print_table(f"{name} ({atlas})", ["SAE", *metrics],
                    [[sae_id, *(_cell(values.get(m)) for m in metrics)] for sae_id, values in flat.items()])


@handle_errors
def eval_command(
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE id to evaluate (repeatable); default: every trained SAE."),
    suite: str = typer.Option("core", help=f"Comma-separated evals to run: {', '.join(EVAL_NAMES)}."),
    tokens: int = typer.Option(DEFAULT_TOKENS, min=1, help="Held-out tokens for the activation metrics."),
    ce_blocks: int = typer.Option(DEFAULT_CE_BLOCKS, min=1, help="Held-out blocks the model runs on for CE / KL."),
    no_model: bool = typer.Option(False, "--no-model", help="Skip the CE / KL metrics (no model forward passes)."),
    probe_data: Path = typer.Option(None, "--probe-data",
                                    help="sparse_probing: a .jsonl labelled set (a 'text' field and --label-field)."),
    label_field: str = typer.Option("label", help="sparse_probing: the label field of --probe-data."),
    probe_set: list[str] = typer.Option([], "--probe-set",
                                        help="sparse_probing: a labelled set to probe (repeatable): topics, "
                                        "code_vs_prose (built in) or a SAEBench set by name, read from the hub, e.g. "
                                        "fancyzhx/ag_news. Default: the built-in sets."),
    per_class: int = typer.Option(None, "--per-class", min=2,
                                  help="sparse_probing: texts per class of each named set (default 32)."),
    ground_truth: Path = typer.Option(None, "--ground-truth",
                                      help="ground_truth: a .safetensors planted dictionary with W_dec [n_atoms, d]."),
    autointerp_backend: str = typer.Option("lexical", help="autointerp: lexical (offline lexical proxy, no LLM), "
                                           "openai (an OpenAI-compatible chat endpoint; key in $SAE_ATLAS_AUTOINTERP_KEY) "
                                           "or hf (--autointerp-model run in-process)."),
    autointerp_url: str = typer.Option("", help="autointerp: the endpoint's base URL, e.g. http://127.0.0.1:8000/v1."),
    autointerp_model: str = typer.Option("", help="autointerp: the model name the endpoint serves (openai) or the "
                                         "model spec to load, e.g. smollm2-135m (hf)."),
    autointerp_latents: int = typer.Option(32, min=1, help="autointerp: latents explained and scored (seeded sample)."),
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
    batch_blocks: int = batch_blocks_option(FROM_MODEL),
) -> None:
    """Evaluate SAEs: `core` (SAEBench metrics: EV, FVU, L0, dead/dense, CE recovered, KL score,
    BOS excluded), `sparse_probing`, `meta`, `mdl`, `ground_truth`, `autointerp`, `absorption`, `scr`, `tpp` (--suite).

    Results: saes/<id>/evals/<eval>.json (SAEBench layout) and, for core, eval.json.
    Finished results are kept (--force recomputes). Under `torchrun --nproc_per_node=R -m sae_atlas
    eval ...` the ranks take the (SAE, eval) jobs in turn and rank 0 prints; with
    --from-model the ranks first split the batches of the streamed `core` and rank 0 writes
    its merged metrics. --json prints {sae: eval.json} for core alone, else {sae: {eval: result}}."""
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.eval.evaluate import read_eval
    from sae_atlas.saes.eval.results import read_result
    from sae_atlas.saes.eval.suite import parse_suite, run_suite

    names = parse_suite(suite)
    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    layout = AtlasLayout(atlas)
    ids = list(sae) or layout.sae_ids()
    if not ids:
        raise InvalidInputError(f"no trained SAEs in {atlas}; run `sae-atlas train --atlas {atlas}` first")
    for sae_id in ids:
        layout.require_sae(sae_id)
    configs = _configs(names, tokens=tokens, ce_blocks=ce_blocks, no_model=no_model, from_model=from_model,
                       probe_data=probe_data, label_field=label_field, probe_sets=probe_set, per_class=per_class,
                       ground_truth=ground_truth,
                       autointerp={"backend": autointerp_backend, "url": autointerp_url, "model": autointerp_model,
                                   "n_latents": autointerp_latents, "negatives": autointerp_negatives})
    core: dict[str, dict[str, Any]] = {}
    suite_names = names
    if from_model and "core" in names:
        streamed = _core_from_model(atlas, ids, configs["core"], tokens=tokens, corpus=corpus, context=context,
                                    batch_blocks=batch_blocks, where=where, ctx=ctx)
        core = streamed or {}
        suite_names = [name for name in names if name != "core"]

    @functools.cache
    def model() -> ModelHandle:
        from sae_atlas.saes.models import load_model

        return load_model(layout.read_meta()["model"], device=rank_device)

    rank_device = ctx.device(str(where)) if ctx else str(where)
    run = run_suite(atlas, ids, suite_names, configs, device=rank_device, model=model, force=force, ctx=ctx)
    if ctx is not None and not ctx.is_main:
        return
    if "core" in suite_names:
        core = {sae_id: read_eval(atlas, sae_id) for sae_id, results in run.results.items() if "core" in results}
    else:
        for sae_id in core:
            run.results[sae_id]["core"] = read_result(atlas, sae_id, "core")
    _print_results(atlas, names, core, run.results, json_out)
    if run.failures:
        raise EvalsFailed("; ".join(f"{name} of SAE {sae_id!r} failed ({message})"
                                    for (sae_id, name), message in run.failures.items()))


def register(app: typer.Typer) -> None:
    """Add the `eval` verb."""
    app.command("eval")(eval_command)
