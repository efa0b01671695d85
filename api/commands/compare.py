"""The CLI layer of `compare`; its other layers: `sae_atlas.api.http.routers.compare` (HTTP),
`sae_atlas.api.operations.compare` (parameter), `sae_atlas.api.results.compare` (typed-result),
`sae_atlas.api.services.compare` (service).

`sae-atlas compare A[:SAE] B[:SAE]`: match two SAEs' latents by activation correlation
streamed from the model(s), score their matched spaces against nulls, store the run in A's
atlas (`analyses/compare/`), print a table or `--json`. `sae-atlas train-crosscoder`: a
crosscoder between two models or hooks and its relative decoder norms. `sae-atlas
latent-scaling`: Latent Scaling of a stored crosscoder's latents."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    console,
    handle_errors,
    open_atlas,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.corpus_options import (
    context_option,
    corpus_option,
    no_bos_option,
    text_field_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option

if TYPE_CHECKING:
    from sae_atlas.api.results.analysis import AnalysisResult


@handle_errors
def compare_command(
    side_a: str = typer.Argument(..., metavar="A[:SAE]", help="Atlas directory and SAE id (the only SAE if omitted)."),
    side_b: str = typer.Argument(..., metavar="B[:SAE]", help="The other side; may be the same atlas."),
    n_tokens: int = typer.Option(20_000, "--n-tokens", "--tokens", help="Corpus tokens to stream (shared or "
                                 "aligned; at least 2)."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    context: int = context_option(),
    no_bos: bool = no_bos_option(),
    batch_blocks: int = typer.Option(8, help="Blocks per forward pass (at least 1)."),
    sample_tokens: int = typer.Option(2048, help="Tokens whose codes feed the activation-space scores (at least 3)."),
    max_items: int = typer.Option(1024, help="Matched pairs entering SVCCA / RSA (a seeded subset beyond; at "
                                             "least 3)."),
    n_perm: int = typer.Option(50, help="Null draws per space score (at least 1)."),
    n_rotations: int = typer.Option(1, "--n-rotations", "--rotations", help="Rotation-null accumulators streamed "
                                    "beside the real one (20 or more for an MCC p-value below 0.05)."),
    min_fires: int = typer.Option(10, help="Leave latents firing on fewer tokens out of the matching."),
    decoder: bool = typer.Option(None, "--decoder/--no-decoder",
                                 help="Match decoder cosines too (default: when the SAEs share d_model)."),
    groups: str = typer.Option(None, help="Score per group of A's latents from a stored run KIND/RUN[:COLUMN], "
                                          "e.g. lobes/<run>."),
    seed: int = typer.Option(0, help="Seed of the nulls and subsets."),
    run: str = typer.Option(None, help="Run name (default <sae_a>--<sae_b>)."),
    top: int = typer.Option(10, min=0, help="Matched pairs to print."),
    json_out: bool = typer.Option(False, "--json", help="Print the stored result as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Compare two SAEs (layers, seeds, widths or models): MCC, mutual nearest neighbours,
    decoder matching, SVCCA / RSA beside their nulls.

    Under `torchrun --nproc_per_node=R -m sae_atlas compare ...` the ranks split the tokens and
    rank 0 merges the statistics and stores the run. The options are
    `api.operations.compare.CompareOptions`, checked there (as `Atlas.compare`)."""
    from sae_atlas.api.operations.compare import CompareOptions
    from sae_atlas.api.services.compare import open_side, run_compare, summary_rows
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed

    dist = init_distributed()
    where = use_by_default(device, model_dtype)
    options = CompareOptions.of(n_tokens=n_tokens, batch_blocks=batch_blocks, sample_tokens=sample_tokens,
                                max_items=max_items, n_perm=n_perm, n_rotations=n_rotations, min_fires=min_fires,
                                seed=seed, decoder=decoder, groups=groups, run=run)
    a = open_side(side_a)
    result = run_compare(a, open_side(side_b, near=a.ctx), options,
                         corpus=CorpusSpec(source=corpus, text_field=text_field, context_size=context,
                                           prepend_bos=not no_bos),
                         device=str(where), dist=dist, progress=not json_out)
    if result is None:
        return
    if json_out:
        print_json(result.to_dict(max_rows=top))
        return
    p = result.parameters
    print_table(f"{p['sae_a']} vs {p['sae_b']} ({result.summary['n_tokens']} tokens)",
                ["score", "value", "null", "p"], summary_rows(result))
    for note in result.notes:
        console.print(note, markup=False)
    if top:
        print_table("best matched pairs", result.pairs.columns, result.pairs.frame.head(top).iter_rows())
    if result.groups:
        print_table("per group", list(result.groups[0]), (row.values() for row in result.groups))
    console.print(f"stored analyses/compare/{result.run}.json in {p['atlas_a']}")


@handle_errors
def train_crosscoder_command(
    atlas: Path = atlas_argument(help="Atlas directory (side A is its model; the crosscoder is stored there)."),
    hook_a: str = typer.Option(..., help="Hook of model A."),
    hook_b: str = typer.Option(..., help="Hook of model B (another layer, or the same layer of --model-b)."),
    model_b: str = typer.Option(None, help="Model B (smollm2-135m, a Hugging Face id or folder, a .gguf, tiny "
                                           "JSON); default: the atlas's model."),
    d_sae: int = typer.Option(4096, help="Crosscoder latents (at least 1)."),
    k: int = typer.Option(32, help="Mean active latents per token (BatchTopK; at least 1)."),
    tokens: int = typer.Option(200_000, "--tokens", "--n-tokens", help="Training tokens (at least 1)."),
    pass_tokens: int = typer.Option(None, help="Corpus tokens per pass (default --tokens; passes repeat)."),
    batch_size: int = typer.Option(1024, help="Rows per training step (at least 1)."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    context: int = context_option(),
    batch_blocks: int = typer.Option(8, help="Blocks per forward pass (at least 1)."),
    seed: int = typer.Option(0, help="Seed of the shuffle and the initialisation."),
    cc_id: str = typer.Option(None, "--id", help="Crosscoder id (default <hook_a>--<hook_b>-<d_sae>)."),
    scaling_tokens: int = typer.Option(0, "--latent-scaling-tokens",
                                       help="Then run Latent Scaling of every latent over this many "
                                            "corpus tokens (0: skip; needs one d_model on both sides)."),
    json_out: bool = typer.Option(False, "--json", help="Print the stored run as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    old_atlas: Path = OLD_ATLAS_OPTION,
) -> None:
    """Train an acausal BatchTopK crosscoder on paired activations of two models (or two
    hooks of one model) at the same tokens; store it in crosscoders/<id>/ and each latent's
    relative decoder norm (A-only / shared / B-only) as analyses/crosscoder/<id>. The options
    are `api.operations.crosscoder.CrosscoderParams`, checked there (as `Atlas.train_crosscoder`)."""
    from sae_atlas.api.context import AtlasContext
    from sae_atlas.api.operations.crosscoder import CrosscoderParams
    from sae_atlas.api.services.crosscoder import run_train_crosscoder
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    atlas = the_atlas(atlas, old_atlas)
    params = CrosscoderParams.of(hook_a=hook_a, hook_b=hook_b, model_b=model_b, d_sae=d_sae, k=k, tokens=tokens,
                                 pass_tokens=pass_tokens, batch_size=batch_size, batch_blocks=batch_blocks,
                                 seed=seed, cc_id=cc_id, scaling_tokens=scaling_tokens)
    where = use_by_default(device, model_dtype)
    result = run_train_crosscoder(AtlasContext(atlas), params,
                                  corpus=CorpusSpec(source=corpus, text_field=text_field, context_size=context),
                                  device=str(where), progress=not json_out)
    if json_out:
        print_json(result.to_dict(max_rows=0))
        return
    s = result.meta["summary"]
    print_table(f"crosscoder {result.run}", ["A-only", "shared", "B-only", "scale A", "scale B"],
                [(s["a_only"], s["shared"], s["b_only"], s["scale_a"], s["scale_b"])])
    _print_b_only(result)
    console.print(f"stored crosscoders/{result.run}/ and analyses/crosscoder/{result.run}.json in {atlas}")


def _print_b_only(result: AnalysisResult, top: int = 10) -> None:
    shown = [c for c in ("latent", "relative_norm", "latent_class", "nu_error", "nu_recon") if c in result.table.columns]
    rows = result.table.sort("relative_norm", descending=True).head(top).select(shown)
    print_table("most B-only latents", rows.columns, rows.iter_rows())


@handle_errors
def latent_scaling_command(
    atlas: Path = atlas_argument(help="Atlas directory holding the crosscoder."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    cc_id: str = typer.Option(..., "--id", help="Crosscoder id (crosscoders/<id>/)."),
    tokens: int = typer.Option(50_000, "--tokens", "--n-tokens", help="Corpus tokens to stream (at least 2)."),
    corpus: str = typer.Option(None, help="Text source (default: the crosscoder's training corpus)."),
    text_field: str = text_field_option(),
    context: int = context_option(),
    batch_blocks: int = typer.Option(8, help="Blocks per forward pass (at least 1)."),
    json_out: bool = typer.Option(False, "--json", help="Print the stored run as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Latent Scaling (Minder et al. 2025) of a crosscoder's latents: the least-squares
    scale of each latent's decoder direction (on its stronger side) in the other model's reconstruction
    error (nu_error: high = Complete Shrinkage) and reconstruction (nu_recon: high = Latent
    Decoupling); near 0 = truly model-specific. Added as columns of analyses/crosscoder/<id>.
    The options are `api.operations.crosscoder.LatentScalingParams`, checked there (as `Atlas.latent_scaling`)."""
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    root = the_atlas(atlas, old_atlas)
    where = use_by_default(device, model_dtype)
    spec = CorpusSpec(source=corpus, text_field=text_field, context_size=context) if corpus else None
    result = open_atlas(root).latent_scaling(cc_id, tokens=tokens, batch_blocks=batch_blocks, corpus=spec,
                                             device=str(where))
    if json_out:
        print_json(result.to_dict(max_rows=0))
        return
    _print_b_only(result)
    console.print(f"stored the Latent Scaling columns of analyses/crosscoder/{result.run}.json in {root}")


def register(app: typer.Typer) -> None:
    """Add the `compare`, `train-crosscoder` and `latent-scaling` verbs."""
    app.command("compare")(compare_command)
    app.command("train-crosscoder")(train_crosscoder_command)
    app.command("latent-scaling")(latent_scaling_command)

