"""`sae-atlas analyze depth`: the residual stream across every layer from one streamed
forward (intrinsic and local dimension, trajectories, CKA, logit and tuned lenses), stored
under `analyses/depth/<run>.*`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    handle_errors,
    print_json,
    print_table,
    the_atlas,
)
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


def parse_layers(text: str | None, option: str = "--layers") -> list[int] | None:
    """`a-b` (inclusive), `a,b,c` or empty (every layer); InvalidInputError naming `option`."""
    if text is None or not text.strip():
        return None
    try:
        if "-" in text:
            lo, hi = (int(part) for part in text.split("-", 1))
            return list(range(lo, hi + 1))
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InvalidInputError(f"{option} must be a range 'a-b' or a list 'a,b,c' of layer numbers, got {text!r}") \
            from exc


@handle_errors
def depth_command(
    atlas: Path = atlas_argument(help="Atlas directory to store the run in."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    model: str = typer.Option("", help="Model spec (default: the atlas' model, else smollm2-135m)."),
    layers: str = typer.Option(None, help="Layers, at least 3: a range 'a-b' or a list 'a,b,c' (default: every "
                                          "layer)."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    context: int = context_option(),
    no_bos: bool = no_bos_option(),
    tokens: int = typer.Option(16384, help="Corpus tokens to stream."),
    batch_blocks: int = batch_blocks_option(bounded=False),
    max_points: int = typer.Option(4000, help="Seeded token subsample for ID, local ID and trajectories (at "
                                              "least 10)."),
    k: int = typer.Option(20, help="Neighbours of the local intrinsic dimension (at least 3)."),
    mle_k: int = typer.Option(10, help="Neighbours of the global MLE dimension (at least 3)."),
    n_boot: int = typer.Option(200, help="Bootstrap draws of the MLE dimension's interval."),
    fit_fraction: float = typer.Option(0.25, help="Share of the batches (the first ones) fitting the tuned lens."),
    space: str = typer.Option("raw", help="Trajectories on raw or unit-normalised states: raw or unit."),
    seed: int = typer.Option(0, help="Seed of the subsample and bootstrap."),
    saes: list[str] = typer.Option(None, "--sae", help="A stored SAE on the residual stream of a read layer "
                                   "(repeatable, or comma-separated): per feature, the local ID and trajectory of "
                                   "the tokens it fires on (table features)."),
    checkpoint_every: int = typer.Option(None, help="Checkpoint the stream every this many batches (default: every "
                                                    "minute, or ten times the last write's duration)."),
    families: Path = typer.Option(None, help="JSON {\"families\": {name: [prompts]}}: metrics per prompt family "
                                  "and their permutation tests instead of the corpus stream."),
    n_permutations: int = typer.Option(2000, help="With --families or --model-b: permutations per test."),
    model_b: str = typer.Option(None, help="Model B on the same texts (an atlas directory: its model; or a model "
                                "spec): CKA of every layer of A against every layer of B and, at the same layers, "
                                "the ID and local-ID shift from A to B with its null (base vs fine-tuned)."),
    layers_b: str = typer.Option(None, help="With --model-b: B's layers (default: --layers when B has them, else "
                                 "every layer of B)."),
    run: str = typer.Option(None, help="Run name (default: depth, depth-families with --families, depth-pair with "
                                       "--model-b)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Per layer: TwoNN and MLE dimension (bootstrap interval), local dimension, trajectory
    step/curvature/convergence, CKA between layers, logit and tuned lens agreement and KL.

    Under `torchrun --nproc_per_node=R -m sae_atlas analyze depth ...` the ranks split the batches:
    the subsample and CKA merge exactly; the tuned lens fits on each rank's first batches.
    --families and --model-b run in one process. The options are
    `api.operations.depth.DepthParams`, checked there (as `Atlas.depth_profile`)."""
    from sae_atlas.api.commands.common import model_of_atlas
    from sae_atlas.api.operations.depth import DepthParams
    from sae_atlas.api.services.depth import run_depth_operation
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed

    root = the_atlas(atlas, old_atlas)
    params = DepthParams.of(layers=parse_layers(layers, "--layers"), tokens=tokens, batch_blocks=batch_blocks,
                            max_points=max_points, k=k, mle_k=mle_k, n_boot=n_boot, fit_fraction=fit_fraction,
                            space=space, seed=seed, saes=[t.strip() for v in saes or [] for t in v.split(",")
                                                          if t.strip()] or None,
                            checkpoint_every=checkpoint_every, families=families, n_permutations=n_permutations,
                            model_b=model_b, layers_b=parse_layers(layers_b, "--layers-b"), run=run)
    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    if ctx is not None:
        use_by_default(ctx.device(str(where)), model_dtype)  # each rank on its own GPU
    spec = CorpusSpec(source=corpus, text_field=text_field, context_size=context, prepend_bos=not no_bos,
                      seed=params.seed)
    out = run_depth_operation(root, model_of_atlas(model, root), params, spec, ctx=ctx, progress=not json_out)
    if out is None:  # a rank other than 0
        return
    if params.families is not None:
        tests = out["tables"]["tests"]
        if json_out:
            print_json({"summary": out["summary"], "tests": tests.to_dicts(), "json_path": str(out["json_path"])})
        else:
            print_table(f"families ({out['json_path']})", tests.columns, tests.rows())
        return
    if params.model_b is not None:
        _print_pair(out, json_out)
        return
    if json_out:
        print_json({"summary": out["summary"], "params": out["params"], "table": out["tables"]["main"].to_dicts(),
                    "json_path": str(out["json_path"])})
        return
    main = out["tables"]["main"].select(TABLE_COLUMNS)
    print_table(f"depth profile ({out['json_path']})", TABLE_COLUMNS, main.rows())
    print_table("summary", ["field", "value"], list(out["summary"].items()))


def _print_pair(out: dict[str, Any], json_out: bool) -> None:
    """A model pair's run: its ID shift table (when computed) and summary, or JSON."""
    shift = out["tables"].get("shift")
    if json_out:
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
