"""The engine layer of `labels`; its other layers: `sae_atlas.api.services.labels` (service).

Offline feature labels computed from a summary's statistics (no model, no network).

A label names what a feature fires on and what it writes: its most frequent centre tokens
among its top examples (ties by the highest activation, then alphabetically), the token
that most often precedes them when it precedes at least half of them (the context), and
the first tokens its decoder direction promotes through the unembedding. A feature that
never fired is labelled `dead`. The same tables always give the same labels.

Example: `fires on "Monday", "Friday" (after "on") · promotes "morning", "night"`.
"""

from __future__ import annotations

import polars as pl

from sae_atlas.saes.encoding.tokens import REPLACEMENT

DEAD = "dead (never fired)"
LABEL_SCHEMA = {"latent": pl.Int64, "text": pl.String}


def _clean(column: str) -> pl.Expr:
    """Stripped text; null where a replacement character shows a cut character (tables
    summarized before characters split over pieces were read whole)."""
    text = pl.col(column).str.strip_chars()
    return pl.when(text.str.contains(REPLACEMENT, literal=True)).then(None).otherwise(text).alias(column)


def _character_start() -> pl.Expr:
    """The centre of each example, moved back to the first piece of its character: a
    character split over pieces reads whole on its first piece and '' on the others
    (`saes.encoding.tokens.decoded_tokens`)."""
    upto = pl.col("tokens").list.head(pl.col("centre") + 1).list.reverse()
    return pl.col("centre") - upto.list.eval(pl.element() != "").list.arg_max().fill_null(0)


def _quoted(tokens: list[str]) -> str:
    return ", ".join(f'"{t}"' for t in tokens)


def auto_labels(features: pl.DataFrame, examples: pl.DataFrame, *, n_tokens: int = 3, n_logits: int = 3) -> pl.DataFrame:
    """One label per latent of `features` (columns latent, text) from its top examples in
    `examples` and its promoted logits (see the module docstring)."""
    start = _character_start()
    top = examples.filter(pl.col("kind") == "top").select(
        "latent", "act",
        pl.col("tokens").list.get(start, null_on_oob=True).alias("token"),
        pl.when(start > 0).then(pl.col("tokens").list.get(start - 1, null_on_oob=True)).alias("before"),
    ).with_columns(_clean("token"), _clean("before")).filter(pl.col("token").is_not_null() & (pl.col("token") != ""))
    fires = (top.group_by("latent", "token").agg(pl.len().alias("n"), pl.col("act").max().alias("best"))
             .sort(["latent", "n", "best", "token"], descending=[False, True, True, False])
             .group_by("latent", maintain_order=True).agg(pl.col("token").head(n_tokens).alias("tokens")))
    n_top = top.group_by("latent").agg(pl.len().alias("n_top"))
    context = (top.filter(pl.col("before").is_not_null() & (pl.col("before") != ""))
               .group_by("latent", "before").agg(pl.len().alias("n"))
               .sort(["latent", "n", "before"], descending=[False, True, False])
               .group_by("latent", maintain_order=True).first()
               .join(n_top, on="latent").filter(pl.col("n") * 2 >= pl.col("n_top")).select("latent", "before"))
    logits = features.select(
        pl.col("latent").cast(pl.Int64), "n_active",
        pl.col("top_logit_tokens").list.eval(pl.element().str.strip_chars()).list.eval(
            pl.element().filter((pl.element() != "") & ~pl.element().str.contains(REPLACEMENT, literal=True)))
        .list.head(n_logits).alias("promotes"))
    rows = (logits.join(fires.with_columns(pl.col("latent").cast(pl.Int64)), on="latent", how="left")
            .join(context.with_columns(pl.col("latent").cast(pl.Int64)), on="latent", how="left").sort("latent"))
    texts = [_text(r) for r in rows.iter_rows(named=True)]
    return pl.DataFrame({"latent": rows["latent"], "text": texts}, schema=LABEL_SCHEMA)


def _text(row: dict) -> str:
    if not row["n_active"]:
        return DEAD
    parts = []
    if row["tokens"]:
        after = f' (after "{row["before"]}")' if row["before"] else ""
        parts.append(f"fires on {_quoted(row['tokens'])}{after}")
    if row["promotes"]:
        parts.append(f"promotes {_quoted(row['promotes'])}")
    return " · ".join(parts) or "no examples or logit effects"
