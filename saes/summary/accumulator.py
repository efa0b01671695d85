"""All per-latent accumulators of one SAE summary, and their conversion to the two tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

from saes.summary.bands import BandSampler
from saes.summary.batch import ActiveEntries, BatchInfo
from saes.summary.logits import LogitEffects
from saes.summary.stats import LatentStats, OctaveScale, histogram_quantiles
from saes.summary.top import TopExamples
from store.errors import InvalidInputError
from store.tables import EXAMPLES_SCHEMA, FEATURES_SCHEMA, ragged_series

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
    rows, width = array_2d.shape
    return ragged_series(name, array_2d.reshape(-1), np.arange(0, rows * width + 1, width), inner)


def _strings(vocab: np.ndarray, ids: np.ndarray) -> np.ndarray:
    safe = np.clip(ids, 0, len(vocab) - 1)
    return np.where((ids >= 0) & (ids < len(vocab)), vocab[safe], "")


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

    def update(self, f_NF: torch.Tensor, info: BatchInfo) -> None:
        """Add a batch of feature activations `[N, d_sae]` (BOS rows are zeroed here)."""
        f = f_NF.float().masked_fill(~info.valid[:, None], 0.0)
        entries = ActiveEntries.of(f, self.params.bins_per_octave)
        shift = self.scale.update(entries)
        self.stats.update(f, int(info.valid.sum()), entries, self.scale.exponent, shift)
        self.top.update(f, info)
        self.bands.update(f, info, entries, self.scale.exponent)

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
        self, decoder_norm: torch.Tensor, logits: LogitEffects | None, vocab: np.ndarray | None
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
            names[f"{side}_logit_tokens"] = _strings(vocab, ids) if logits and vocab is not None else None
            for name, value in names.items():
                columns[name] = (
                    _list_column(name, value, FEATURES_SCHEMA[name].inner)
                    if value is not None
                    else pl.Series(name, [None] * self.d_sae, dtype=FEATURES_SCHEMA[name])
                )
        frame = pl.DataFrame(columns)
        return frame.with_columns(
            pl.when(~pl.Series(dead)).then(pl.col(c)).otherwise(None).alias(c)
            for c in ("mean_active_act", "quantiles")
        ).with_columns(pl.col("mean_active_act").fill_nan(None))

    def _example_arrays(self) -> dict[str, np.ndarray]:
        """Top and band examples as flat numpy columns plus `[E, W]` window arrays."""
        top, bands, p = self.top, self.bands, self.params
        latent_t, slot = (top.values > 0).nonzero(as_tuple=True)
        band = bands.bands(self.scale.exponent)
        exp = self.scale.exponent[bands.latent].double()
        parts = {
            "latent": (latent_t, bands.latent),
            "is_top": (torch.ones_like(latent_t, dtype=torch.bool), torch.zeros_like(bands.latent, dtype=torch.bool)),
            "band": (torch.full_like(latent_t, -1), band),
            "band_lo": (torch.full_like(latent_t, torch.nan, dtype=torch.float64), torch.exp2(exp - band - 1)),
            "band_hi": (torch.full_like(latent_t, torch.nan, dtype=torch.float64), torch.exp2(exp - band)),
            "rank": (slot, torch.zeros_like(bands.latent)),
            "act": (top.values[latent_t, slot], bands.value),
        }
        for name in top.payload:
            parts[name] = (top.payload[name][latent_t, slot], bands.payload[name])
        out = {name: torch.cat([a.cpu(), b.cpu()]).numpy() for name, (a, b) in parts.items()}
        n_top = len(latent_t)
        band_part = slice(n_top, None)
        order = np.lexsort((-out["act"][band_part], out["band"][band_part], out["latent"][band_part]))
        group = out["latent"][band_part][order] * p.n_bands + out["band"][band_part][order]
        starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
        ranks = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        for name in out:
            out[name][band_part] = out[name][band_part][order]
        out["rank"][band_part] = ranks
        return out

    def examples_frame(self, vocab: np.ndarray | None) -> pl.DataFrame:
        """One row per example (top-k, then band samples) in the `examples.parquet` schema."""
        a = self._example_arrays()
        inside = a["win_tokens"] >= 0
        offsets = np.r_[0, np.cumsum(inside.sum(1))]
        tokens = a["win_tokens"][inside]
        before = self.params.window_before
        is_top = a["is_top"]
        columns = {
            "latent": a["latent"],
            "kind": np.where(is_top, "top", "band"),
            "band": pl.Series(np.where(is_top, 0, a["band"])).cast(pl.Int16),
            "band_lo": a["band_lo"],
            "band_hi": a["band_hi"],
            "rank": a["rank"],
            "act": a["act"],
            "token_id": a["win_tokens"][:, before] if len(is_top) else np.zeros(0, np.int32),
            "block": a["block"],
            "pos": a["pos"],
            "doc_id": a["doc"],
            "centre": np.minimum(a["pos"], before),
            "token_ids": ragged_series("token_ids", tokens, offsets, pl.Int32()),
            "acts": ragged_series("acts", a["win_acts"][inside], offsets, pl.Float32()),
            "tokens": (
                ragged_series("tokens", _strings(vocab, tokens), offsets, pl.String())
                if vocab is not None
                else pl.Series("tokens", [None] * len(is_top), dtype=EXAMPLES_SCHEMA["tokens"])
            ),
        }
        frame = pl.DataFrame(columns)
        top_rows = pl.Series(is_top)
        return frame.with_columns(
            pl.when(top_rows).then(None).otherwise(pl.col(c)).alias(c) for c in ("band", "band_lo", "band_hi")
        )
