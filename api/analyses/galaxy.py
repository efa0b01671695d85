"""The analysis-run layer of `galaxy`; its other layers: `sae_atlas.geometry.galaxy` (maths).

The galaxy view (`analyses/galaxy/`): decoder-spectrum power law and TwoNN intrinsic
dimension per SAE, ordered by layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.api.analyses.run_files import run_figure
from sae_atlas.errors import NotFoundError
from sae_atlas.geometry.figures import galaxy_figure
from sae_atlas.geometry.galaxy import covariance_spectrum, power_law_fit
from sae_atlas.geometry.intrinsic_dimension import twonn_dimension
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.hooks import hook_layer
from sae_atlas.store.layout import AtlasLayout


def run_galaxy(
    atlas: str | Path, sae_ids: list[str] | None = None, *, ranks: tuple[int, int] = (10, 150),
    twonn_points: int = 20000, seed: int = 0, run: str = "galaxy",
) -> dict[str, Any]:
    """Power-law slope of the unit-decoder covariance spectrum and TwoNN dimension for each
    SAE (all SAEs of the atlas by default), ordered by layer."""
    ids = sae_ids or AtlasLayout(atlas).sae_ids()
    if not ids:
        raise NotFoundError(f"atlas {atlas} has no SAEs yet; train one with `sae-atlas train`")
    rows, spectra, fits = [], {}, {}
    for sae_id in ids:
        sae = load_atlas_sae(atlas, sae_id)
        W = sae.W_dec.detach().float().numpy()
        ev = covariance_spectrum(W, unit=True)
        fit = power_law_fit(ev, ranks)
        spectra[sae_id], fits[sae_id] = ev, fit
        tn = twonn_dimension(unit_rows(W), max_points=twonn_points, seed=seed)
        rows.append({"sae_id": sae_id, "hook": sae.cfg.hook_name, "layer": hook_layer(sae.cfg.hook_name),
                     "d_sae": len(W), "slope": fit.slope, "alpha": fit.alpha, "fit_r2": fit.r2,
                     "rank_lo": fit.lo, "rank_hi": fit.hi, "twonn_dimension": tn.dimension})
    table = pl.DataFrame(rows).sort(["layer", "sae_id"])
    order = table["sae_id"].to_list()
    fig = run_figure(galaxy_figure({i: spectra[i] for i in order}, {i: fits[i] for i in order}), atlas, "galaxy", run,
                "spectra")
    params = {"sae_ids": order, "ranks": list(ranks), "twonn_points": twonn_points, "seed": seed}
    js = write_analysis(atlas, "galaxy", run, parameters=params, tables={"main": table}, extra={"figures": [fig]},
                        summary={"alpha_by_sae": dict(zip(order, table["alpha"].to_list(), strict=True))})
    return {"table": table, "params": params, "json_path": js}
