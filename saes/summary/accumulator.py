"""All per-latent accumulators of one SAE summary, and their conversion to the two tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.summary.bands import BandSampler
from sae_atlas.saes.summary.batch import ActiveEntries, BatchInfo
from sae_atlas.saes.summary.logits import LogitEffects
from sae_atlas.saes.summary.stats import LatentStats, OctaveScale, histogram_quantiles
from sae_atlas.saes.summary.top import TopExamples
from sae_atlas.store.tables import EXAMPLES_SCHEMA, FEATURES_SCHEMA, padded_list

QUANTILE_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999)


@dataclass(frozen=True)
class SummaryParams:
    """What a summary computes (recorded in tables.json; results do not depend on batching)."""

    top_k: int = 20
    window_before: int = 16
    window_after: int = 4
    n_bands: int = 6
    per_band: int = 4
    bins_per_octave: int = 8
    n_octaves: int = 20
    quantile_levels: tuple[float, ...] = QUANTILE_LEVELS
    n_logits: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("top_k", "n_bands", "per_band", "bins_per_octave", "n_octaves", "n_logits")
        bad = [name for name in positive if getattr(self, name) <= 0]
        if bad or self.window_before < 0 or self.window_after < 0:
            raise InvalidInputError(
                f"summary parameters {bad or ['window']} must be positive (window sizes >= 0)"
            )
        if not all(0 <= q <= 1 for q in self.quantile_levels):
            raise InvalidInputError(f"quantile levels must lie in [0, 1], got {self.quantile_levels}")

    def to_dict(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["quantile_levels"] = list(self.quantile_levels)
        return out


def _list_column(name: str, array_2d: np.ndarray, inner: pl.DataType) -> pl.Series:
    return padded_list(name, np.ascontiguousarray(array_2d).reshape(-1), array_2d.shape[1], inner)


def _strings(vocab: pl.Series, ids: np.ndarray) -> pl.Series:
    """Token strings of `ids` (flattened); ids outside the vocabulary give ''."""
    flat = ids.reshape(-1)
    inside = (flat >= 0) & (flat < len(vocab))
    return pl.concat([vocab, pl.Series([""])]).gather(np.where(inside, flat, len(vocab)))


class SummaryAccumulator:
    """Streams batches into statistics, exact top-k examples and band samples of every latent.

    State size is O(d_sae * (n_bins + (top_k + n_bands * per_band) * window)), independent
    of the number of tokens.
    """

    def __init__(self, d_sae: int, params: SummaryParams, device: torch.device | str = "cpu") -> None:
        p = self.params = params
        self.d_sae = d_sae
        self.scale = OctaveScale(d_sae, p.bins_per_octave, device)
        self.stats = LatentStats(d_sae, p.n_octaves, p.bins_per_octave, device)
        self.top = TopExamples(d_sae, p.top_k, p.window_before, p.window_after, device)
        self.bands = BandSampler(d_sae, p.n_bands, p.per_band, p.window_before, p.window_after,
                                 p.bins_per_octave, p.seed, device)

    @property
    def n_tokens(self) -> int:
        return self.stats.n_tokens

    def update(self, f_NF: torch.Tensor, info: BatchInfo) -> ActiveEntries:
        """Add a batch of feature activations `[N, d_sae]` (BOS rows are skipped); return
        its non-zero entries."""
        f = f_NF.float()
        entries = ActiveEntries.of(f, info.valid, self.params.bins_per_octave)
        shift = self.scale.update(entries)
        self.stats.update(int(info.valid.sum()), entries, self.scale.exponent, shift)
        self.bands.shift(shift)
        self.top.update(f, info, entries)
        self.bands.update(f, info, entries, self.scale.exponent)
        return entries

    def state_nbytes(self) -> int:
        """Bytes of accumulator state (bounded; see the class docstring)."""
        return self.stats.state_nbytes() + self.top.state_nbytes() + self.bands.state_nbytes() + (
            self.scale.exponent.numel() * 8
        )

    # tables -----------------------------------------------------------------------------
    def hist_top(self) -> torch.Tensor:
        """Each latent's histogram scale `2**e` (0 for latents that never fired)."""
        top = torch.exp2(self.scale.exponent.double().clamp(min=-1000))
        return torch.where(self.scale.seen, top, torch.zeros_like(top)).float()

    def features_frame(
        self, decoder_norm: torch.Tensor, logits: LogitEffects | None, vocab: pl.Series | None
    ) -> pl.DataFrame:
        """One row per latent in the `features.parquet` schema."""
        s, p = self.stats, self.params
        n_active = s.n_active.cpu().numpy()
        dead = n_active == 0
        hist_top = self.hist_top().cpu()
        quantiles = histogram_quantiles(s.counts.cpu(), hist_top, p.bins_per_octave,
                                        list(p.quantile_levels), s.max.cpu()).numpy()
        total = s.sum.cpu().numpy()
        columns: dict[str, object] = {
            "latent": np.arange(self.d_sae, dtype=np.int32),
            "n_active": n_active,
            "density": n_active / max(s.n_tokens, 1),
            "mean_act": total / max(s.n_tokens, 1),
            "mean_active_act": np.where(dead, np.nan, total / np.maximum(n_active, 1)),
            "max_act": s.max.cpu().numpy(),
            "quantiles": _list_column("quantiles", quantiles, pl.Float32()),
            "hist_top": hist_top.numpy(),
            "hist_counts": _list_column("hist_counts", s.counts.cpu().numpy(), pl.Int64()),
            "decoder_norm": decoder_norm.detach().float().cpu().numpy(),
        }
        for side in ("top", "bottom"):
            ids = getattr(logits, f"{side}_ids").numpy().astype(np.int32) if logits else None
            names = {f"{side}_logit_ids": ids}
            names[f"{side}_logit_values"] = getattr(logits, f"{side}_values").numpy() if logits else None
            for name, value in names.items():
                columns[name] = (
                    _list_column(name, value, FEATURES_SCHEMA[name].inner)
                    if value is not None
                    else pl.Series(name, [None] * self.d_sae, dtype=FEATURES_SCHEMA[name])
                )
            tokens = f"{side}_logit_tokens"
            columns[tokens] = (
                padded_list(tokens, _strings(vocab, ids), ids.shape[1], pl.String())
                if logits and vocab is not None
                else pl.Series(tokens, [None] * self.d_sae, dtype=FEATURES_SCHEMA[tokens])
            )
        frame = pl.DataFrame(columns)
        return frame.with_columns(
            pl.when(~pl.Series(dead)).then(pl.col(c)).otherwise(None).alias(c)
            for c in ("mean_active_act", "quantiles")
        ).with_columns(pl.col("mean_active_act").fill_nan(None))

    def _example_arrays(self) -> dict[str, np.ndarray]:
        """Top then band examples as flat numpy columns (windows as `[E, W]` arrays)."""
        top = self.top.entries()
        bands = self.bands.entries(self.scale.exponent)
        n_top = len(top["latent"])
        top["band"] = torch.full((n_top,), -1, dtype=torch.long)
        top["band_lo"] = top["band_hi"] = torch.full((n_top,), torch.nan, dtype=torch.float64)
        out = {name: torch.cat([top[name].cpu(), bands[name].cpu()]).numpy() for name in bands}
        out["is_top"] = np.arange(len(out["latent"])) < n_top
        return out

    def examples_frame(self, vocab: pl.Series | None) -> pl.DataFrame:
        """One row per example (top-k, then band samples) in the `examples.parquet` schema."""
        a = self._example_arrays()
        width = a["win_tokens"].shape[1]
        inside = a["win_tokens"] >= 0
        start, length = inside.argmax(1), inside.sum(1)
        before = self.params.window_before
        is_top = a["is_top"]

        def window(name: str, flat: np.ndarray | pl.Series, inner: pl.DataType) -> pl.Series:
            return padded_list(name, flat, width, inner, start, length)

        columns = {
            "latent": a["latent"],
            "kind": np.where(is_top, "top", "band"),
            "band": a["band"],
            "band_lo": a["band_lo"],
            "band_hi": a["band_hi"],
            "rank": a["rank"],
            "act": a["act"],
            "token_id": a["win_tokens"][:, before],
            "block": a["block"],
            "pos": a["pos"],
            "doc_id": a["doc"],
            "centre": before - start,
            "token_ids": window("token_ids", a["win_tokens"].reshape(-1), pl.Int32()),
            "acts": window("acts", a["win_acts"].reshape(-1), pl.Float32()),
            "tokens": (
                window("tokens", _strings(vocab, a["win_tokens"]), pl.String())
                if vocab is not None
                else pl.Series("tokens", [None] * len(is_top), dtype=EXAMPLES_SCHEMA["tokens"])
            ),
        }
        top_rows = pl.Series(is_top)
        return pl.DataFrame(columns).with_columns(
            pl.when(top_rows).then(None).otherwise(pl.col(c)).alias(c) for c in ("band", "band_lo", "band_hi")
        )
