"""The service layer of `search`; its other layers: `sae_atlas.api.commands.search` (CLI),
`sae_atlas.api.http.routers.search` (HTTP), `sae_atlas.api.operations.search` (parameter),
`sae_atlas.api.results.search` (typed-result), `sae_atlas.store.search` (persistence).

Feature searches: decoder-direction neighbours, nearest to a vector and cross-layer
flow over the FAISS indexes (`store.search.FeatureSearch`), features tied to a token from
the summaries, and features firing on a text (runs the model)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.search import TextSearchParams
from sae_atlas.api.results.feature import Match as MatchRow
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.search import CentredLatent, PromotingLatent, TextSearch, TokenFeatures
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services import saes
from sae_atlas.api.services.labels import labelled_token_features, with_labels
from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.encoding.tokens import token_features
from sae_atlas.store.search import Filters, Match, matches_frame


def similar(view: SaeView, latent: int, k: int) -> Rows[MatchRow]:
    """The `k` latents of the same SAE whose decoder directions are nearest (cosine)."""
    matches = view.ctx.search().similar(view.sae_id, view.latent(latent), k)
    return Rows(MatchRow, with_labels(view.ctx, matches_frame(matches), {view.sae_id: view}))


def flow(view: SaeView, latent: int, k: int) -> Rows[MatchRow]:
    """The latent's best matches in every other SAE of the same width, by layer."""
    matches = view.ctx.search().flow(view.sae_id, view.latent(latent), k=k)
    return Rows(MatchRow, with_labels(view.ctx, matches_frame(matches), {view.sae_id: view}))


def cross_layer_card(view: SaeView, latent: int, k: int) -> tuple[list[Match], dict[str, str] | None]:
    """A feature card's cross-layer matches, and the damaged SAEs left out of them (named
    with their problem; None when none is)."""
    search = view.ctx.search()
    try:
        return search.flow(view.sae_id, latent, k=k), None
    except IntegrityError:
        broken = saes.damaged(view.ctx)
        if not broken or view.sae_id in broken:
            raise
    healthy = tuple(s for s in view.ctx.sae_ids() if s not in broken)
    return search.flow(view.sae_id, latent, k=k, filters=Filters(sae_ids=healthy)), broken


def by_vector(ctx: AtlasContext, vector: Any, views: list[SaeView], k: int, filters: Filters) -> Rows[MatchRow]:
    """The `k` latents over `views` whose decoder directions are nearest to `vector` (of
    length d_in; SAEs of another width are left out) and pass `filters`."""
    widths = {view.sae_id: view.d_in for view in views}
    vector_D = _direction(vector, set(widths.values()))
    matching = tuple(sid for sid, d in widths.items() if d == vector_D.shape[0])
    search = ctx.search()
    if len(matching) == 1:
        matches = search.by_vector(vector_D, k, sae_id=matching[0], filters=filters)
    else:
        matches = search.by_vector(vector_D, k, filters=replace(filters, sae_ids=matching))
    return Rows(MatchRow, with_labels(ctx, matches_frame(matches), {view.sae_id: view for view in views}))


def _direction(values: Any, widths: set[int]) -> np.ndarray:
    """`values` as a float32 direction, scaled by its largest entry first so that neither
    huge nor tiny finite numbers overflow or vanish."""
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"vector must be a list of numbers ({exc})") from exc
    valid = " or ".join(map(str, sorted(widths))) or "(no SAEs)"
    if array.shape[0] not in widths:
        raise InvalidInputError(f"vector has {array.shape[0]} entries; the SAEs' d_in is {valid}")
    if not np.all(np.isfinite(array)) or not np.any(array):
        raise InvalidInputError("vector must be finite and not all zero")
    return (array / np.abs(array).max()).astype(np.float32)


def search_token(ctx: AtlasContext, token: str | int, views: list[SaeView], k: int) -> TokenFeatures:
    """Features whose top examples centre on `token` and features whose logit effects
    promote it (a token id, or a string looked up in the model's vocabulary), with their labels."""
    token_id, token_str = _token_id(ctx, token)
    centred, promoting = [], []
    for view in views:
        tables = view.tables()
        centred.append(tables.latents_centred_on(token_id, limit=k).with_columns(pl.lit(view.sae_id).alias("sae_id")))
        promoting.append(tables.latents_promoting(token_id, limit=k).with_columns(pl.lit(view.sae_id).alias("sae_id")))
    by_id = {view.sae_id: view for view in views}

    def labelled(frame: pl.DataFrame) -> pl.DataFrame:
        return with_labels(ctx, frame.with_columns(pl.col("latent").cast(pl.Int64)), by_id).drop("explanations")

    return TokenFeatures(
        token=token_str, token_id=token_id,
        centred=Rows(CentredLatent, labelled(pl.concat(centred).sort("n_examples", "max_act", descending=True).head(k))),
        promoting=Rows(PromotingLatent, labelled(pl.concat(promoting).sort("logit", descending=True).head(k))),
    )


def _token_id(ctx: AtlasContext, token: str | int) -> tuple[int, str | None]:
    if isinstance(token, (int, np.integer)) and not isinstance(token, bool):
        if token < 0:
            raise InvalidInputError(f"token id must be non-negative, got {token}")
        return int(token), None
    if not isinstance(token, str) or not token:
        raise InvalidInputError("token must be a token id or a non-empty string")
    vocab = _summary_vocab(ctx)
    if token in vocab:
        return vocab[token], token
    tokenizer = ctx.model().tokenizer  # not seen in any summary: ask the tokenizer (loads the model)
    ids = tokenizer.convert_tokens_to_ids([token])
    if not ids or ids[0] is None or (ids[0] == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise NotFoundError(f"token {token!r} is not in the model's vocabulary")
    return int(ids[0]), token


def _summary_vocab(ctx: AtlasContext) -> dict[str, int]:
    """Token string -> id, from the token strings of the summaries (examples and logit
    effects), so common lookups need no model."""
    def load() -> dict[str, int]:
        vocab: dict[str, int] = {}
        for sae_id in ctx.sae_ids():
            tables = open_sae(ctx, sae_id).tables()
            pairs = [tables.examples.select("token_ids", "tokens").explode("token_ids", "tokens")]
            for side in ("top", "bottom"):
                pairs.append(tables.features.select(
                    pl.col(f"{side}_logit_ids").alias("token_ids"), pl.col(f"{side}_logit_tokens").alias("tokens")
                ).explode("token_ids", "tokens"))
            for tid, tok in pl.concat(pairs).drop_nulls().unique().iter_rows():
                vocab.setdefault(tok, int(tid))
        return vocab

    return ctx.cache.get(("vocab",), load)


def search_text(ctx: AtlasContext, views: list[SaeView], params: TextSearchParams) -> TextSearch:
    """Run the model on `params.text` and encode each token with each SAE of `views`: per
    token, the `k` most active features with their labels; tokens are shown decoded
    (`' October'`). The model's special tokens (BOS, EOS, padding: the positions summaries
    and evals leave out, whose activations dwarf every real token's) are left out unless
    `include_special`."""
    text, k, include_special = params.text, params.k, params.include_special
    if not views:
        raise NotFoundError(f"the atlas {ctx.root} has no SAEs yet")
    modules = {view.sae_id: view.module() for view in views}
    hooks = {view.sae_id: view.hook for view in views}
    handle = ctx.model()
    found = ctx.run_locked(lambda: token_features(handle, modules, hooks, text, k))
    keep = [pos for pos, special in enumerate(found.special) if include_special or not special]
    features = {sid: [per_token[pos] for pos in keep] for sid, per_token in found.features.items()}
    return TextSearch(text=text, token_ids=[found.token_ids[pos] for pos in keep],
                      tokens=[found.tokens[pos] for pos in keep], positions=keep,
                      special=[found.special[pos] for pos in keep],
                      features=labelled_token_features(ctx, features, {view.sae_id: view for view in views}))

