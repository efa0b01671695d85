"""The CLI layer of `search`; its other layers: `sae_atlas.api.http.routers.search` (HTTP),
`sae_atlas.api.operations.search` (parameter), `sae_atlas.api.results.search` (typed-result),
`sae_atlas.api.services.search` (service), `sae_atlas.store.search` (persistence).

`sae-atlas search ...`: SAEs, similar features, by vector, by text, by token, cross-layer flow,
contrast of two text sets, concept search, geometry records, labels, crosscoder latents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sae_atlas.api.commands.common import handle_errors, open_atlas, print_json, print_table
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.errors import InvalidInputError

if TYPE_CHECKING:
    import polars as pl

    from sae_atlas.api.results.rows import Rows

search_app = typer.Typer(help="Search the features of an atlas.", no_args_is_help=True)
ATLAS = typer.Argument(..., help="Atlas directory.")
JSON = typer.Option(False, "--json", help="Print JSON.")
K = typer.Option(10, "-k", "--k", help="Number of results (1..100).")
SAES = typer.Option([], "--sae", "--sae-id", help="SAE to search (repeatable; default all).")
IN_CIRCLE = typer.Option(None, "--in-circle/--not-in-circle", help="In a circle, or in none.")
PERIOD = typer.Option(None, help="In a circle of this fitted period (within 0.5).")
LOBE = typer.Option(None, help="In this co-occurrence lobe.")


def _show(title: str, table: pl.DataFrame | Rows[Any], json_out: bool) -> None:
    from sae_atlas.api.results.rows import Rows  # polars: loaded when a result is shown

    frame = table.frame if isinstance(table, Rows) else table
    if json_out:
        print_json(frame.to_dicts())
    else:
        print_table(title, frame.columns, frame.iter_rows())


@search_app.command("saes")
@handle_errors
def saes_command(atlas: Path = ATLAS, json_out: bool = JSON) -> None:
    """List the SAEs of the atlas."""
    _show("SAEs", open_atlas(atlas).saes(), json_out)


@search_app.command("similar")
@handle_errors
def similar_command(atlas: Path = ATLAS, sae_id: str = typer.Argument(...), index: int = typer.Argument(...),
                    k: int = K, json_out: bool = JSON) -> None:
    """Features of the same SAE with the nearest decoder directions. The options are
    `api.operations.search.SimilarParams`, checked there."""
    _show(f"similar to {sae_id} / {index}", open_atlas(atlas).similar(sae_id, index, k=k), json_out)


@search_app.command("flow")
@handle_errors
def flow_command(atlas: Path = ATLAS, sae_id: str = typer.Argument(...), index: int = typer.Argument(...),
                 k: int = typer.Option(5, "-k", "--k", help="Matches per other SAE (1..100)."),
                 json_out: bool = JSON) -> None:
    """Best matches of a feature in every other SAE (cross-layer flow). The options are
    `api.operations.search.FlowParams`, checked there."""
    _show(f"flow of {sae_id} / {index}", open_atlas(atlas).flow(sae_id, index, k=k), json_out)


@search_app.command("vector")
@handle_errors
def vector_command(atlas: Path = ATLAS,
                   vector: str = typer.Argument(..., help="JSON list of numbers, or a .npy / .json file."),
                   saes: list[str] = SAES, k: int = K, in_circle: bool = IN_CIRCLE, period: float = PERIOD,
                   lobe: int = LOBE, json_out: bool = JSON) -> None:
    """Features nearest to a direction in residual space (geometry filters: features of the
    stored circles and lobes). The options are `api.operations.search.VectorSearchParams`, checked there."""
    _show("nearest features", open_atlas(atlas).search_vector(
        _read_vector(vector), saes=saes or None, k=k, in_circle=in_circle, period=period, lobe=lobe), json_out)


def _read_vector(value: str) -> list[float]:
    path = Path(value)
    if path.suffix == ".npy" and path.is_file():
        import numpy as np

        return np.load(path).reshape(-1).tolist()
    try:
        return json.loads(path.read_text() if path.suffix == ".json" and path.is_file() else value)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"vector must be a JSON list of numbers or a .npy/.json file ({exc})") from exc


@search_app.command("text")
@handle_errors
def text_command(atlas: Path = ATLAS, text: str = typer.Argument(...),
                 saes: list[str] = typer.Option([], "--sae", "--sae-id",
                                                help="SAE to encode with (repeatable; default all)."),
                 k: int = typer.Option(5, "-k", "--k", help="Features per token and SAE (1..100)."),
                 json_out: bool = JSON,
                 include_special: bool = typer.Option(False, "--include-special",
                                                      help="Keep BOS and the model's other special tokens."),
                 device: str = device_option("cpu"), model_dtype: str = model_dtype_option()) -> None:
    """Which features fire on each token of a text (runs the model; BOS left out). The
    options are `api.operations.search.TextSearchParams`, checked there."""
    from sae_atlas.saes.devices import use_by_default

    use_by_default(device, model_dtype)
    result = open_atlas(atlas).search_text(text, saes=saes or None, k=k, include_special=include_special)
    if json_out:
        print_json(result.to_dict())
        return
    for sid, per_token in result.features.items():
        print_table(sid, ["pos", "token", "features (latent:act)", "top feature's label"], [
            (pos, tok, "  ".join(f"{f['latent']}:{f['act']:.3g}" for f in feats), feats[0].get("label") or "" if feats else "")
            for pos, tok, feats in zip(result.positions, result.tokens, per_token, strict=True)
        ])


@search_app.command("token")
@handle_errors
def token_command(atlas: Path = ATLAS, token: str = typer.Argument(..., help="Token string, or an id with --id."),
                  as_id: bool = typer.Option(False, "--id", help="TOKEN is a token id."),
                  saes: list[str] = SAES, k: int = K, json_out: bool = JSON) -> None:
    """Features whose examples centre on a token, and features promoting it. The options
    are `api.operations.search.TokenSearchParams`, checked there."""
    if as_id and not token.isdigit():
        raise InvalidInputError(f"--id needs a non-negative integer token id, got {token!r}")
    result = open_atlas(atlas).search_token(int(token) if as_id else token, saes=saes or None, k=k)
    if json_out:
        print_json(result.to_dict())
        return
    _show(f"centred on {token!r}", result.centred, False)
    _show(f"promoting {token!r}", result.promoting, False)


def _read_texts(value: str) -> list[str]:
    """Texts from a file: a JSON list of strings, or one text per non-empty line."""
    path = Path(value)
    if not path.is_file():
        raise InvalidInputError(f"{value!r} is not a file; give a .json list of strings or a text file, one per line")
    raw = path.read_text()
    if path.suffix == ".json":
        try:
            texts = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path} is not valid JSON ({exc})") from exc
        if not isinstance(texts, list):
            raise InvalidInputError(f"{path} must hold a JSON list of strings")
        return texts
    return [line for line in raw.splitlines() if line.strip()]


@search_app.command("contrast")
@handle_errors
def contrast_command(
    atlas: Path = ATLAS,
    texts_a: str = typer.Argument(..., help="Set A: a .json list of strings or a text file, one text per line."),
    texts_b: str = typer.Argument(..., help="Set B, the same way."),
    saes: list[str] = typer.Option([], "--sae", "--sae-id", help="SAE to encode with (repeatable; default all)."),
    k: int = typer.Option(20, "-k", "--k", help="Number of results (1..100)."),
    pool: str = typer.Option("max", help="Pooling of a text's token activations: max or mean."),
    n_permutations: int = typer.Option(20_000, "--n-permutations", "--permutations",
                                       help="Most permutations per feature (1..1,000,000)."),
    alpha: float = typer.Option(0.05, help="False discovery rate for 'significant'."),
    duplicate_threshold: float = typer.Option(0.9, help="Decoder cosine at which features group as duplicates."),
    seed: int = typer.Option(0, help="Seed of the permutations."),
    json_out: bool = JSON,
) -> None:
    """Features that separate two sets of texts (AUROC, effect size, permutation p, BH q).
    The options are `api.operations.search.ContrastParams`, checked there."""
    result = open_atlas(atlas).contrast(_read_texts(texts_a), _read_texts(texts_b), saes=saes or None, k=k,
                                        pool=pool, n_permutations=n_permutations, alpha=alpha,
                                        duplicate_threshold=duplicate_threshold, seed=seed)
    if json_out:
        print_json(result.to_dict())
        return
    _show(f"contrast: {result.n_significant} features with q <= {alpha}", result.table.frame.select(
        "rank", "sae_id", "latent", "label", "diff", "auroc", "effect_size", "q_value", "group"), False)


@search_app.command("concept")
@handle_errors
def concept_command(
    atlas: Path = ATLAS,
    concept: str = typer.Argument(..., help="weekdays, months, colours, or a JSON file (values, templates, kind)."),
    saes: list[str] = typer.Option([], "--sae", "--sae-id", help="SAE to search (repeatable; default all)."),
    min_fire_rate: float = typer.Option(0.5, help="Share of a value's prompts a feature must fire on (0, 1]."),
    min_selectivity: float = typer.Option(0.5, help="Share of a feature's variance the value must explain (0, 1]."),
    target: float = typer.Option(0.9, help="Explained variance at which the span stops growing (0, 1]."),
    max_features: int = typer.Option(8, help="Largest span (1..32)."),
    seed: int = typer.Option(0, help="Seed of the held-out split."),
    save: str = typer.Option(None, help="Store the result as analysis run concept_search/<SAVE>."),
    json_out: bool = JSON,
) -> None:
    """Features that carry a concept, the few whose decoder span captures it, and its geometry.
    The options are `api.operations.concept.ConceptSearchParams`, checked there."""
    result = open_atlas(atlas).concept_search(concept, saes=saes or None, min_fire_rate=min_fire_rate,
                                              min_selectivity=min_selectivity, target=target,
                                              max_features=max_features, seed=seed, save=save)
    if json_out:
        print_json(result.to_dict())
        return
    print_table(f"concept {result.concept['name']} ({result.kind}); best SAE {result.best}",
                ["sae_id", "span", "explained", "score", "fit"],
                [(sid, s["span"], s["explained"][-1] if s["explained"] else 0.0, s["score"],
                  _fit_line(s["fit"])) for sid, s in result.per_sae.items()])
    _show("concept features", result.features[:30], False)


def _fit_line(fit: dict) -> str:
    if "lda_accuracy" in fit:
        return f"LDA accuracy {fit['lda_accuracy']:.3f} (chance {fit['chance']:.3f})"
    if "r2" in fit:
        return (f"circle R2 {fit['r2']:.3f} (loo {fit['r2_loo']:.3f}), cyclic {fit['cyclic_order']}, "
                f"period {fit['fitted_period']:.2f}")
    return fit.get("note", "")


@search_app.command("geometry")
@handle_errors
def geometry_command(
    atlas: Path = ATLAS,
    saes: list[str] = SAES,
    in_circle: bool = IN_CIRCLE,
    period: float = PERIOD,
    lobe: int = LOBE,
    kind: str = typer.Option(None, help="Only records of this kind: circle, concept, hierarchy, lobe."),
    rebuild: bool = typer.Option(False, "--rebuild", help="First rebuild the records from the stored analyses."),
    json_out: bool = JSON,
) -> None:
    """Features by the geometry results they belong to (circles, concept spans, lobes). The
    options are `api.operations.search.GeometrySearchParams`, checked there."""
    handle = open_atlas(atlas)
    if rebuild:
        handle.rebuild_geometry()
    _show("geometry records", handle.geometry_features(saes or None, in_circle=in_circle, period=period, lobe=lobe,
                                                       kind=kind), json_out)


@search_app.command("labels")
@handle_errors
def labels_command(
    atlas: Path = ATLAS,
    query: str = typer.Argument(None, help="Words to look for in labels and explanations."),
    saes: list[str] = typer.Option([], "--sae", "--sae-id", help="SAE to search or rebuild (repeatable; default "
                                                                  "all); with --import, the one SAE it is for."),
    k: int = K,
    rebuild: bool = typer.Option(False, "--rebuild", help="First compute and store the offline labels."),
    import_path: Path = typer.Option(None, "--import", help="First import explanations: Neuronpedia .json or .csv."),
    source: str = typer.Option(None, help="Name of the imported set (default: the file name)."),
    json_out: bool = JSON,
) -> None:
    """Find features by words in their offline labels and imported explanations (local BM25).
    The options are `api.operations.search.LabelSearchParams`, checked there."""
    handle = open_atlas(atlas)
    if rebuild:
        typer.echo(f"labels: {handle.build_labels(saes or None)}", err=True)
    if import_path is not None:
        if len(saes) != 1:
            raise InvalidInputError("--import needs one --sae: the SAE the explanations belong to")
        typer.echo(f"imported {handle.import_explanations(saes[0], import_path, source=source)} explanations", err=True)
    if query is not None:
        _show(f"labels matching {query!r}", handle.search_labels(query, saes=saes or None, k=k), json_out)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was on the command line (typer's own click names the source)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@search_app.command("crosscoder")
@handle_errors
def crosscoder_command(
    ctx: typer.Context,
    atlas: Path = ATLAS,
    crosscoder: str = typer.Argument(None, help="Crosscoder id (default: list the stored crosscoders)."),
    latent_class: str = typer.Option(None, "--latent-class", "--only",
                                     help="Only latents of this class: a_only, shared or b_only."),
    sort: str = typer.Option("relative_norm", help="Column to sort by: relative_norm, norm_a, norm_b, latent, "
                                                   "or a Latent Scaling column."),
    descending: bool = typer.Option(True, "--descending/--ascending", help="Largest first (--ascending: smallest)."),
    offset: int = typer.Option(0, help="First latent of the page (0..2**31-1)."),
    limit: int = typer.Option(100, "--limit", help="Latents to show (1..1000)."),
    latent: int = typer.Option(None, min=0, help="Show this latent's card: both decoder norms and the "
                                                 "nearest atlas features per side."),
    k: int = typer.Option(5, "-k", "--k", help="With --latent: nearest atlas features per side (1..100). "
                                               "Without it: the deprecated spelling of --limit."),
    json_out: bool = JSON,
) -> None:
    """Crosscoder latents by class (e.g. only in B: --latent-class b_only), or one latent's card.
    The page's options are `api.operations.pages.CrosscoderLatentsParams`, the card's
    `CrosscoderLatentParams`, checked there."""
    if latent is None and _given(ctx, "k"):
        if _given(ctx, "limit"):
            raise InvalidInputError("-k/--k is the card's option (with --latent); give the page's size as --limit only")
        typer.secho("warning: -k/--k for the page's size is deprecated; use --limit", fg="yellow", err=True)
        limit = k
    handle = open_atlas(atlas)
    if crosscoder is None:
        rows = handle.crosscoders()
        if json_out:
            print_json(rows)
        else:
            print_table("crosscoders", ["crosscoder", "side A", "side B", "d_sae", "a_only", "shared", "b_only"],
                        ([r["crosscoder"], f"{r['model_a']} {r['hook_a']}", f"{r['model_b']} {r['hook_b']}", r["d_sae"],
                          r["a_only"], r["shared"], r["b_only"]] for r in rows))
        return
    if latent is not None:
        card = handle.crosscoder_latent(crosscoder, latent, k=k)
        if json_out:
            print_json(card.to_dict())
            return
        print_table(f"{crosscoder} / latent {latent}", ["", "value"], [
            ("norm_a", card.norm_a), ("norm_b", card.norm_b), ("relative_norm", card.relative_norm),
            ("class", card.latent_class), *card.scaling.items()])
        for side, near in (("A", card.nearest_a), ("B", card.nearest_b)):
            if near:
                print_table(f"nearest features, side {side}", ["sae_id", "latent", "cosine", "label"],
                            (n.values() for n in near))
        for note in card.notes:
            typer.echo(note, err=True)
        return
    page = handle.crosscoder_latents(crosscoder, latent_class=latent_class, sort=sort, descending=descending,
                                     offset=offset, limit=limit)
    if json_out:
        print_json(page.to_dict())
        return
    extra = list(page.rows[0]["scaling"]) if page.rows else []
    print_table(f"{crosscoder}: {page.total} {latent_class or 'all'} latents by {sort}",
                ["latent", "norm_a", "norm_b", "relative_norm", "latent_class", *extra],
                ([r["latent"], r["norm_a"], r["norm_b"], r["relative_norm"], r["latent_class"],
                  *r["scaling"].values()] for r in page.rows))


def register(app: typer.Typer) -> None:
    """Add the `search` command group."""
    app.add_typer(search_app, name="search")
