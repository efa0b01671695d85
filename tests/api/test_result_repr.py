"""Every result type's `repr` is one short line (long lists and frames as their size),
while `_repr_html_` keeps the full notebook view."""

from __future__ import annotations

import importlib
import pkgutil

import polars as pl

import sae_atlas.api.results as results_package
from sae_atlas.api.results.feature import Feature
from sae_atlas.api.results.wire import JsonResult


def _feature(n_bins: int) -> Feature:
    example = {"act": 1.5, "block": 0, "pos": 3, "centre": 1, "tokens": ["a", "b", "c"], "acts": [0.0, 1.5, 0.2]}
    logit = {"token_id": 7, "token": " x", "value": 0.5}
    return Feature(
        sae_id="layer8", index=3, hook="blocks.8.hook_resid_post",
        stats={"n_active": 10, "density": 0.01, "mean_act": 0.1, "mean_active_act": 2.0, "max_act": 9.0,
               "decoder_norm": 1.0, "quantiles": {"0.5": 1.0}},
        histogram={"edges": [i / 3 for i in range(n_bins + 2)], "counts": list(range(n_bins + 1))},
        examples=[example] * 40, top_logits=[logit] * 20, bottom_logits=[logit] * 20,
        label="fires on " + ", ".join(f'"token{i}"' for i in range(50)),
    )


def test_repr_is_short_whatever_the_size() -> None:
    small, large = repr(_feature(10)), repr(_feature(5000))
    assert len(large) == len(small) < 700
    assert large.startswith("Feature(sae_id='layer8', index=3, hook='blocks.8.hook_resid_post'")
    assert "examples=[40 items]" in large and "histogram={2 keys}" in large and "label='fires on" in large
    assert "top examples" in _feature(10)._repr_html_()  # the notebook view is untouched


def test_every_result_type_has_the_short_repr() -> None:
    for module in pkgutil.iter_modules(results_package.__path__):
        importlib.import_module(f"sae_atlas.api.results.{module.name}")
    types, todo = [], list(JsonResult.__subclasses__())
    while todo:
        cls = todo.pop()
        types.append(cls)
        todo.extend(cls.__subclasses__())
    assert len(types) >= 10
    assert all(cls.__repr__ is JsonResult.__repr__ for cls in types), [c for c in types if c.__repr__ is not JsonResult.__repr__]


def test_frames_show_their_shape() -> None:
    from sae_atlas.api.results.rows import Rows
    from sae_atlas.api.results.search import CentredLatent, PromotingLatent, TokenFeatures

    frame = pl.DataFrame({"latent": list(range(300)), "n_examples": [1] * 300, "max_act": [1.0] * 300,
                          "sae_id": ["s"] * 300, "label": [None] * 300})
    promoting = frame.head(2).drop("n_examples", "max_act").with_columns(logit=pl.lit(0.5))
    text = repr(TokenFeatures(token=" cat", token_id=5, centred=Rows(CentredLatent, frame),
                              promoting=Rows(PromotingLatent, promoting)))
    assert text == ("TokenFeatures(token=' cat', token_id=5, centred=<300 CentredLatent rows>, "
                    "promoting=<2 PromotingLatent rows>)")
    assert repr(TokenFeatures(token=None, token_id=1, centred=frame, promoting=frame)).endswith("<300x5 frame>)")


def test_table_results_show_their_row_type_and_first_rows() -> None:
    from sae_atlas.api.results.feature import Match
    from sae_atlas.api.results.rows import SHOWN, Rows

    frame = pl.DataFrame({"sae_id": ["s"] * 300, "latent": list(range(300)), "cosine": [0.5] * 300,
                          "rank": list(range(300)), "layer": [3] * 300, "label": ["a very long label " * 20] * 300})
    lines = repr(Rows(Match, frame)).splitlines()
    assert lines[0] == "Rows[Match]: 300 rows (sae_id, latent, cosine, rank, layer, label)"
    assert len(lines) == SHOWN + 2 and lines[-1] == f"  ... {300 - SHOWN} more" and len("\n".join(lines)) <= 2000
    assert "<b>Match</b>" in Rows(Match, frame)._repr_html_()
