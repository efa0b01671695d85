"""`sae-atlas analyze depth`: the residual stream across every layer from one streamed
forward (intrinsic and local dimension, trajectories, CKA, logit and tuned lenses), stored
under `analyses/depth/<run>.*`."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors, print_json, print_table
from sae_atlas.api.commands.corpus_options import (
    batch_blocks_option,
    context_option,
    corpus_option,
    no_bos_option,
    text_field_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.errors import InvalidInputError

TABLE_COLUMNS = ["layer", "twonn", "mle", "mle_low", "mle_high", "lid_q50", "curvature", "cosine_to_final",
                 "logit_top1", "logit_kl", "tuned_top1", "tuned_kl", "tuned_fit_loss"]


def parse_layers(text: str) -> list[int] | None:
    """`a-b` (inclusive), `a,b,c` or empty (every layer)."""
    if not text.strip():
        return None
    try:
        if "-" in text:
            lo, hi = (int(part) for part in text.split("-", 1))
            return list(range(lo, hi + 1))
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InvalidInputError(f"--layers must be a range 'a-b' or a list 'a,b,c' of layer numbers, got {text!r}") \
            from exc


@handle_errors
def depth_command(
    atlas: Path = typer.Option(..., help="Atlas directory to store the run in."),
    model: str = typer.Option("", help="Model spec (default: the atlas' model, else smollm2-135m)."),
    layers: str = typer.Option("", help="Layers: a range 'a-b' or a list 'a,b,c' (default: every layer)."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    context: int = context_option(),
    no_bos: bool = no_bos_option(),
    n_tokens: int = typer.Option(16384, "--tokens", min=1, help="Corpus tokens to stream."),
    batch_blocks: int = batch_blocks_option(),
    max_points: int = typer.Option(4000, min=10, help="Seeded token subsample for ID, local ID and trajectories."),
    k: int = typer.Option(20, min=3, help="Neighbours of the local intrinsic dimension."),
    mle_k: int = typer.Option(10, min=3, help="Neighbours of the global MLE dimension."),
    fit_fraction: float = typer.Option(0.25, help="Share of the batches (the first ones) fitting the tuned lens."),
    space: str = typer.Option("raw", help="Trajectories on raw or unit-normalised states: raw or unit."),
    seed: int = typer.Option(0, help="Seed of the subsample and bootstrap."),
    sae: str = typer.Option("", help="Comma-separated stored SAE ids: per feature, the local ID and trajectory of "
                                     "the tokens it fires on (table features)."),
    families: Path = typer.Option(None, help="JSON {\"families\": {name: [prompts]}}: metrics per prompt family "
                                  "and their permutation tests instead of the corpus stream."),
    n_permutations: int = typer.Option(2000, min=1, help="With --families or --model-b: permutations per test."),
    model_b: str = typer.Option("", help="Model B on the same texts (an atlas directory: its model; or a model "
                                "spec): CKA of every layer of A against every layer of B and, at the same layers, "
                                "the ID and local-ID shift from A to B with its null (base vs fine-tuned)."),
    layers_b: str = typer.Option("", help="With --model-b: B's layers (default: --layers when B has them, else "
                                 "every layer of B)."),
    run: str = typer.Option("", help="Run name (default: depth, or depth-families with --families)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Per layer: TwoNN and MLE dimension (bootstrap interval), local dimension, trajectory
    step/curvature/convergence, CKA between layers, logit and tuned lens agreement and KL.

    Under `torchrun --nproc_per_node=R -m sae_atlas analyze depth ...` the ranks split the batches:
    the subsample and CKA merge exactly; the tuned lens fits on each rank's first batches."""
    from sae_atlas.api.analyses.depth import run_depth
    from sae_atlas.api.commands.common import model_of_atlas
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed

    if space not in ("raw", "unit"):
        raise InvalidInputError(f"--space must be raw or unit, got {space!r}")
    if families is not None:
        from sae_atlas.api.analyses.depth import run_depth_families

        use_by_default(device, model_dtype)
        out = run_depth_families(atlas, model_of_atlas(model, atlas), families, parse_layers(layers), k=k, space=space,
                                 n_permutations=n_permutations, seed=seed, run=run or "depth-families")
        if as_json:
            print_json({"summary": out["summary"], "tests": out["tables"]["tests"].to_dicts(),
                        "json_path": str(out["json_path"])})
        else:
            tests = out["tables"]["tests"]
            print_table(f"families ({out['json_path']})", tests.columns, tests.rows())
        return
    if model_b:
        _pair(atlas, model, model_b, corpus, text_field, context, no_bos, layers, layers_b, n_tokens, batch_blocks,
              max_points, k, mle_k, n_permutations, seed, run, as_json, device, model_dtype)
        return
    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    if ctx is not None:
        use_by_default(ctx.device(str(where)), model_dtype)  # each rank on its own GPU
    handle = model_of_atlas(model, atlas)
    spec = CorpusSpec(source=corpus, text_field=text_field, context_size=context, prepend_bos=not no_bos, seed=seed)
    out = run_depth(atlas, handle, spec, parse_layers(layers), n_tokens=n_tokens, batch_blocks=batch_blocks,
                    max_points=max_points, k=k, mle_k=mle_k, fit_fraction=fit_fraction, space=space, seed=seed,
                    run=run or "depth", progress=not as_json, ctx=ctx,
                    sae_ids=[t.strip() for t in sae.split(",") if t.strip()])
    if out is None:  # a rank other than 0
        return
    if as_json:
        print_json({"summary": out["summary"], "params": out["params"], "table": out["tables"]["main"].to_dicts(),
                    "json_path": str(out["json_path"])})
        return
    main = out["tables"]["main"].select(TABLE_COLUMNS)
    print_table(f"depth profile ({out['json_path']})", TABLE_COLUMNS, main.rows())
    print_table("summary", ["field", "value"], list(out["summary"].items()))


def _pair(atlas: Path, model: str, model_b: str, corpus: str, text_field: str, context: int, no_bos: bool,
          layers: str, layers_b: str, n_tokens: int, batch_blocks: int, max_points: int, k: int, mle_k: int,
          n_permutations: int, seed: int, run: str, as_json: bool, device: str, model_dtype: str) -> None:
    """`analyze depth --model-b`: A against B on the same texts (`api.analyses.depth.run_depth_pair`)."""
    from sae_atlas.api.analyses.depth import run_depth_pair
    from sae_atlas.api.commands.common import model_of_atlas
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InvalidInputError("analyze depth --model-b runs in one process; start it without torchrun")
    use_by_default(device, model_dtype)
    other = model_of_atlas("", Path(model_b)) if Path(model_b).is_dir() and (Path(model_b) / "atlas.json").exists() \
        else model_of_atlas(model_b, None)
    spec = CorpusSpec(source=corpus, text_field=text_field, context_size=context, prepend_bos=not no_bos, seed=seed)
    out = run_depth_pair(atlas, model_of_atlas(model, atlas), other, spec, parse_layers(layers), parse_layers(layers_b),
                         n_tokens=n_tokens, batch_blocks=batch_blocks, max_points=max_points, k=k, mle_k=mle_k,
                         n_permutations=n_permutations, seed=seed, run=run or "depth-pair", progress=not as_json)
    shift = out["tables"].get("shift")
    if as_json:
        print_json({"summary": out["summary"], "params": out["params"], "json_path": str(out["json_path"]),
                    "shift": None if shift is None else shift.to_dicts()})
        return
    if shift is not None:
        columns = ["layer", "mle_a", "mle_b", "mle_shift", "mle_shift_p", "lid_a", "lid_b", "lid_shift", "lid_shift_p"]
        print_table(f"ID shift, B minus A ({out['json_path']})", columns, shift.select(columns).rows())
    print_table("summary", ["field", "value"], list(out["summary"].items()))


def register_analyze(analyze_app: typer.Typer) -> None:
    """Add `depth` to the `analyze` sub-app."""
    analyze_app.command("depth")(depth_command)
