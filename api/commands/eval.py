"""`sae-atlas eval`: evaluate trained SAEs on held-out tokens and write their eval.json."""

from __future__ import annotations

from pathlib import Path

import typer

from api.commands.common import handle_errors, print_json, print_table
from api.commands.corpus_options import (
    FROM_MODEL,
    batch_blocks_option,
    context_option,
    corpus_option,
)
from api.commands.device_options import device_option, model_dtype_option
from saes.devices import use_by_default
from saes.distributed import init_distributed
from saes.eval.evaluate import DEFAULT_CE_BLOCKS, DEFAULT_TOKENS, evaluate_atlas_sae
from store.errors import InvalidInputError
from store.layout import AtlasLayout

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


@handle_errors
def eval_command(
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE id to evaluate (repeatable); default: every trained SAE."),
    tokens: int = typer.Option(DEFAULT_TOKENS, min=1, help="Held-out tokens for the activation metrics."),
    ce_blocks: int = typer.Option(DEFAULT_CE_BLOCKS, min=1, help="Held-out blocks the model runs on for CE / KL."),
    no_model: bool = typer.Option(False, "--no-model", help="Skip the CE / KL metrics (no model forward passes)."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    from_model: bool = typer.Option(False, "--from-model",
                                    help="Activation metrics over --tokens corpus tokens streamed through the model."),
    corpus: str = corpus_option(FROM_MODEL),
    context: int = context_option(FROM_MODEL),
    batch_blocks: int = batch_blocks_option(FROM_MODEL),
) -> None:
    """Evaluate SAEs (SAEBench metrics: EV, FVU, L0, dead/dense, CE recovered, KL score), BOS excluded.

    With --from-model it also runs under `torchrun --nproc_per_node=R -m api eval ...`: the
    ranks split the batches and rank 0 writes the merged metrics. Evaluating cached
    held-out rows is one process."""
    ctx = init_distributed()
    if ctx is not None and not from_model:
        raise InvalidInputError("under torchrun `eval` needs --from-model (evaluating cached held-out rows "
                                "runs in one process; start it without torchrun)")
    where = use_by_default(device, model_dtype)
    layout = AtlasLayout(atlas)
    ids = list(sae) or layout.sae_ids()
    if not ids:
        raise InvalidInputError(f"no trained SAEs in {atlas}; run `sae-atlas train --atlas {atlas}` first")
    handle = None
    if from_model:
        from saes.corpus import CorpusSpec
        from saes.eval.stream import evaluate_from_model
        from saes.models import load_model

        handle = load_model(layout.read_meta()["model"], device=ctx.device(str(where)) if ctx else where)
        results = evaluate_from_model(handle, atlas, ids, corpus=CorpusSpec(source=corpus, context_size=context),
                                      n_tokens=tokens, batch_blocks=batch_blocks, ctx=ctx)
        if ctx is not None and not ctx.is_main:
            return
    elif not no_model:
        from saes.models import load_model

        handle = load_model(layout.read_meta()["model"])
    if not from_model:
        results = {
            sae_id: evaluate_atlas_sae(atlas, sae_id, n_tokens=tokens, ce_blocks=ce_blocks,
                                       with_model=not no_model, model_handle=handle)
            for sae_id in ids
        }
    if json_out:
        print_json(results)
        return
    rows = []
    for sae_id, record in results.items():
        metrics = record["metrics"]
        rows.append([sae_id, record["parameters"]["hook"], metrics["n_tokens"],
                     *(_cell(metrics.get(key)) for key, _ in COLUMNS)])
    print_table(f"SAE evaluation ({atlas})", ["SAE", "hook", "tokens", *(label for _, label in COLUMNS)], rows)


def register(app: typer.Typer) -> None:
    """Add the `eval` verb."""
    app.command("eval")(eval_command)
