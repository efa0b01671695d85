"""`Atlas(path)`: the whole atlas from Python and notebooks.

```python
from api import Atlas
atlas = Atlas("atlas-demo")
atlas.saes()                          # polars frame, one row per SAE
f = atlas.feature(sae_id, 12)         # stats, histogram, top examples, logits, neighbours, map
atlas.similar(sae_id, 12, k=10)       # decoder-direction neighbours (FAISS)
atlas.search_vector(v, k=10)          # features nearest to a direction
atlas.search_text("the cat sat")      # which features fire on each token (runs the model)
atlas.search_token("monday")          # features whose examples centre on / promote a token
atlas.flow(sae_id, 12)                # best matches of the feature in the other layers' SAEs
atlas.map(sae_id, basis="decoder"); atlas.analyses(); atlas.analysis(kind, run)
atlas.contrast(texts_a, texts_b)      # features separating two sets of texts (runs the model)
atlas.concept_search("weekdays")      # features carrying a concept, their span and its geometry
atlas.geometry_features(in_circle=True, period=7)   # features by the geometry they belong to
atlas.search_labels("weekday")        # features by words in their labels and explanations
```

Everything is read lazily and kept: the model is loaded only by the searches that run it
(text, contrast, concept). Results
are dataclasses with `to_dict()` (what the HTTP service returns), `_repr_html_()` for
Jupyter and, where a picture helps, `.plot()`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from api import atlas_meaning, atlas_search, atlas_sources
from api.atlas_meaning import Pool
from api.results.analysis import AnalysisResult
from api.results.feature import Feature
from api.results.meaning import ConceptResult, ContrastResult
from api.results.search import TextSearch, TokenFeatures
from geometry.maps import Basis, basis_frame, map_scores
from store.errors import IntegrityError, InvalidInputError, NotFoundError
from store.layout import AtlasLayout
from store.search import Filters, matches_frame

MAX_K = 100
MAX_TEXT_CHARS = 2000
MAX_EXAMPLES = 50


def check_k(k: int, what: str = "k", maximum: int = MAX_K) -> int:
    """`k` if it is an integer in 1..maximum, else InvalidInputError."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= maximum:
        raise InvalidInputError(f"{what} must be an integer in 1..{maximum}, got {k!r}")
    return int(k)


class Atlas:
    """Read-only view of one atlas directory (SAEs, summaries, indexes, maps, analyses)."""

    def __init__(self, root: str | Path, *, model: Any = None) -> None:
        """Open the atlas at `root`; `model` (a ModelHandle or spec) overrides atlas.json's."""
        self.layout = AtlasLayout(root)
        self.root = self.layout.root
        if not self.layout.atlas_json.exists():
            raise NotFoundError(f"{self.root} is not an atlas (no atlas.json); create one with `sae-atlas cache`")
        self.meta = self.layout.read_meta()
        self._model_override = model
        self._cache = atlas_sources.ResourceCache()
        self._model_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Atlas({str(self.root)!r}, saes={self.sae_ids})"

    # SAEs ---------------------------------------------------------------------------------
    @property
    def sae_ids(self) -> list[str]:
        """Ids of the SAEs with saved weights or registered in atlas.json (a registered SAE
        whose files are missing stays listed; reading it raises IntegrityError)."""
        return self.layout.sae_ids()

    def saes(self) -> pl.DataFrame:
        """One row per SAE: id, hook, architecture, widths, held-out metrics and `status`:
        "ok", or "damaged" with `problem` naming the damaged file and its repair."""
        rows = [self.sae_status(sae_id) for sae_id in self.sae_ids]
        return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"sae_id": pl.String})

    def sae_status(self, sae_id: str) -> dict[str, Any]:
        """`sae_info` plus `status` "ok"; for a damaged SAE (`damage`) what atlas.json
        records of it, `status` "damaged" and the `problem`."""
        problem = self._damage_or_missing(sae_id)
        if problem is None:
            return {**self.sae_info(sae_id), "status": "ok", "problem": None}
        recorded = self.meta.get("saes", {}).get(sae_id, {})
        keys = ("hook", "architecture", "d_in", "d_sae", "k", "fvu", "l0", "dead_fraction")
        return {"sae_id": sae_id, **{key: recorded.get(key) for key in keys},
                "source": (recorded.get("source") or {}).get("source") or "trained",
                "suspect": bool(recorded.get("suspect")), "status": "damaged", "problem": self._describe(problem)}

    def damage(self, sae_id: str) -> IntegrityError | None:
        """What makes an SAE unservable: the IntegrityError of a missing, truncated or
        mismatched file among its config, weights, summary tables, map and index; None when
        they verify (or are not built yet). Loads and keeps what its pages read, so the first
        call is the SAE's preload; the answer is kept for the life of the Atlas."""
        def check() -> IntegrityError | None:
            try:
                self.sae_info(sae_id)
                atlas_sources.verify_weights(self.root, sae_id)
                for load in (self._tables, self.map):
                    try:
                        load(sae_id)
                    except NotFoundError:  # not summarized / no map yet: pages show what exists
                        pass
                if atlas_search.has_index(self.root, sae_id):
                    atlas_search.load_index(self._cache, self.root, sae_id)
            except IntegrityError as exc:
                return exc
            return None

        self.layout.require_sae(sae_id)
        return self._cache.get(("damage", sae_id), check)

    def damaged(self) -> dict[str, str]:
        """The damaged SAEs (`damage`) and what is wrong with each: the file (relative to the
        atlas), the problem and the repair."""
        return {sae_id: self._describe(problem) for sae_id in self.sae_ids
                if (problem := self._damage_or_missing(sae_id))}

    def _describe(self, problem: IntegrityError) -> str:
        path = Path(problem.path)
        shown = path.relative_to(self.root) if path.is_relative_to(self.root) else path
        return f"{shown}: {problem.problem}. To repair: {problem.repair}"

    def _damage_or_missing(self, sae_id: str) -> IntegrityError | None:
        try:
            return self.damage(sae_id)
        except IntegrityError as exc:  # registered in atlas.json, cfg.json missing
            return exc

    def add_sae(self, source: str | Path, *, hook: str | None = None, sae_id: str | None = None,
                link: bool = False, force: bool = False, registry: str | Path | None = None,
                with_model: bool = True) -> dict[str, Any]:
        """Import a pretrained SAE (a folder in a known layout, `RELEASE/SAE_ID` from a
        registry, or `hf://org/repo/path[@revision]`) into this atlas, after the misload
        guard (`saes.importing.import_sae`); returns what was imported and its metrics."""
        from saes.importing import import_sae

        handle = self._model_override if hasattr(self._model_override, "hook_names") else None
        result = import_sae(self.root, source, hook=hook, sae_id=sae_id, link=link, force=force,
                            registry=registry, with_model=with_model, model_handle=handle)
        self.meta = self.layout.read_meta()
        return result.to_dict()

    def sae_info(self, sae_id: str) -> dict[str, Any]:
        """Facts about one SAE (from atlas.json and its cfg.json; read once, then kept);
        NotFoundError if unknown."""
        self.layout.require_sae(sae_id)
        return dict(self._cache.get(("info", sae_id), lambda: self._read_info(sae_id)))

    def _read_info(self, sae_id: str) -> dict[str, Any]:
        cfg = atlas_sources.sae_config(self.root, sae_id)
        recorded = self.meta.get("saes", {}).get(sae_id, {})
        info = {
            "sae_id": sae_id,
            "hook": atlas_sources.sae_hook(self.root, sae_id),
            "architecture": atlas_sources.sae_architecture(cfg),
            "d_in": cfg.get("d_in"),
            "d_sae": cfg.get("d_sae"),
        }
        for key in ("k", "fvu", "l0", "dead_fraction"):
            info[key] = recorded.get(key)
        info["source"] = (recorded.get("source") or {}).get("source") or "trained"
        info["suspect"] = bool(recorded.get("suspect"))
        return info

    def _tables(self, sae_id: str) -> Any:
        self.layout.require_sae(sae_id)
        return self._cache.get(("tables", sae_id), lambda: atlas_sources.feature_tables(self.root, sae_id))

    def _sae(self, sae_id: str) -> Any:
        self.layout.require_sae(sae_id)
        return self._cache.get(("sae", sae_id), lambda: atlas_sources.load_sae(self.root, sae_id))

    def _check_latent(self, sae_id: str, index: int) -> int:
        d_sae = int(self.sae_info(sae_id)["d_sae"])
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise InvalidInputError(f"feature index must be an integer, got {index!r}")
        if not 0 <= index < d_sae:  # no such feature: NotFoundError, 404 over HTTP
            raise NotFoundError(f"feature index {index} out of range for SAE {sae_id!r}: valid 0..{d_sae - 1}")
        return int(index)

    def preload(self) -> None:
        """Load now what feature pages and searches read (summary tables, maps, indexes and
        the neighbour tables of every SAE pair of one width), so that no request pays for it.
        A damaged SAE (`damage`) does not stop the others: it is reported by `saes()` and
        its own pages raise the IntegrityError."""
        damaged = self.damaged()
        indexed = [s for s in self.sae_ids if s not in damaged and atlas_search.has_index(self.root, s)]
        atlas_search.preload(self._cache, self.root, indexed)

    # features -----------------------------------------------------------------------------
    def feature(self, sae_id: str, index: int, *, examples: int = 10, neighbours: int = 8) -> Feature:
        """Everything about one feature: stats, histogram, top examples, logit effects,
        nearest decoder neighbours in its SAE, best cross-layer matches and map position."""
        index = self._check_latent(sae_id, index)
        info = self.sae_info(sae_id)
        examples = check_k(examples, "examples", MAX_EXAMPLES)
        neighbours = check_k(neighbours, "neighbours")
        tables = self._tables(sae_id)
        row = tables.feature(index)
        stats = {key: row[key] for key in ("n_active", "density", "mean_act", "mean_active_act",
                                           "max_act", "decoder_norm")}
        stats["quantiles"] = dict(zip(map(str, tables.params.get("quantile_levels", [])), row["quantiles"] or [], strict=False))
        top = tables.examples_for(index, "top").head(examples)
        cross_layer = self._cross_layer(sae_id, index, min(neighbours, 5)) if atlas_search.has_index(
            self.root, sae_id) else ([], None)
        return Feature(
            sae_id=sae_id,
            index=index,
            hook=info["hook"],
            stats=stats,
            histogram=atlas_sources.histogram(tables, row),
            examples=top.select("act", "block", "pos", "centre", "tokens", "acts").to_dicts(),
            top_logits=_logits(row, "top"),
            bottom_logits=_logits(row, "bottom"),
            neighbours=self._if_indexed(sae_id, lambda: atlas_search.similar(
                self._cache, self.root, sae_id, index, neighbours)),
            cross_layer=self._if_indexed(sae_id, lambda: cross_layer[0]),
            map_position=self._map_position(sae_id, index),
            damaged_saes=cross_layer[1],
            geometry=self._records(sae_id, "geometry").filter(pl.col("latent") == index).drop("sae_id").to_dicts(),
            **self._with_labels(pl.DataFrame({"sae_id": [sae_id], "latent": [index]})).select(
                "label", "explanations").row(0, named=True),
        )

    def _cross_layer(self, sae_id: str, index: int, k: int) -> tuple[list[Any], dict[str, str] | None]:
        """A feature card's cross-layer matches, and the damaged SAEs left out of them (named
        with their problem; None when none is)."""
        try:
            return atlas_search.cross_layer(self._cache, self.root, sae_id, index, k), None
        except IntegrityError:
            damaged = self.damaged()
            if not damaged or sae_id in damaged:
                raise
        healthy = [s for s in self.sae_ids if s not in damaged]
        matches = atlas_search.cross_layer(self._cache, self.root, sae_id, index, k, among=healthy)
        return matches, damaged

    def examples(self, sae_id: str, index: int, kind: str | None = None) -> pl.DataFrame:
        """All stored example contexts of a feature (top-k and activation bands)."""
        return self._tables(sae_id).examples_for(self._check_latent(sae_id, index), kind)

    def features(self, sae_id: str) -> pl.DataFrame:
        """The SAE's per-latent summary table (features.parquet)."""
        return self._tables(sae_id).features

    def _if_indexed(self, sae_id: str, run: Any) -> list[dict[str, Any]] | None:
        """A neighbour list for a feature card, or None when the SAE has no index yet."""
        return [m.as_row() for m in run()] if atlas_search.has_index(self.root, sae_id) else None

    def _map_position(self, sae_id: str, index: int) -> dict[str, Any] | None:
        try:
            frame = self.map(sae_id)
        except NotFoundError:
            return None
        if index < frame.height and frame["latent"][index] == index:  # maps are stored in latent order
            return frame.row(index, named=True)
        hit = frame.filter(pl.col("latent") == index)
        return hit.row(0, named=True) if hit.height else None

    # searches -----------------------------------------------------------------------------
    def similar(self, sae_id: str, index: int, k: int = 10) -> pl.DataFrame:
        """The `k` latents of the same SAE whose decoder directions are nearest (cosine)."""
        index = self._check_latent(sae_id, index)
        return self._with_labels(matches_frame(atlas_search.similar(self._cache, self.root, sae_id, index, check_k(k))))

    def search_vector(self, vector: Any, *, sae_id: str | None = None, k: int = 10, in_circle: bool | None = None,
                      period: float | None = None, lobe: int | None = None) -> pl.DataFrame:
        """Latents whose decoder directions are nearest to `vector` (length d_in), in one SAE
        or, by default, in every SAE of that width; columns sae_id, latent, cosine. The
        geometry filters (`in_circle`, `period`, `lobe`) keep the features whose geometry
        records match (see `geometry_features`)."""
        k = check_k(k)
        ids = [sae_id] if sae_id is not None else self.sae_ids
        widths = {i: int(self.sae_info(i)["d_in"]) for i in ids}
        v = _vector(vector, set(widths.values()))
        matching = [i for i, d in widths.items() if d == v.shape[0]]
        filters = Filters(in_circle=in_circle, period=period, lobe=lobe)
        return self._with_labels(matches_frame(atlas_search.by_vector(self._cache, self.root, matching, v, k, filters)))

    def flow(self, sae_id: str, index: int, k: int = 5) -> pl.DataFrame:
        """Cross-layer flow: the best-matching latents of this feature in the other SAEs of the
        model (by decoder cosine); columns sae_id, hook, latent, cosine."""
        index = self._check_latent(sae_id, index)
        return self._with_labels(matches_frame(atlas_search.cross_layer(self._cache, self.root, sae_id, index, check_k(k))))

    def search_token(self, token: str | int, *, sae_id: str | None = None, k: int = 10) -> TokenFeatures:
        """Features whose top examples centre on `token` and features whose logit effects
        promote it (a token id, or a string looked up in the model's vocabulary)."""
        k = check_k(k)
        token_id, token_str = self._token_id(token)
        centred, promoting = [], []
        for sid in [sae_id] if sae_id is not None else self.sae_ids:
            tables = self._tables(sid)
            centred.append(tables.latents_centred_on(token_id, limit=k).with_columns(pl.lit(sid).alias("sae_id")))
            promoting.append(tables.latents_promoting(token_id, limit=k).with_columns(pl.lit(sid).alias("sae_id")))
        return TokenFeatures(
            token=token_str, token_id=token_id,
            centred=pl.concat(centred).sort("n_examples", "max_act", descending=True).head(k),
            promoting=pl.concat(promoting).sort("logit", descending=True).head(k),
        )

    def search_text(self, text: str, *, sae_ids: list[str] | None = None, k: int = 5) -> TextSearch:
        """Run the model on `text` and encode each token with each SAE: per token, the `k`
        most active features. Loads the model (atlas.json "model") on first use."""
        if not isinstance(text, str) or not text:
            raise InvalidInputError("text must be a non-empty string")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInputError(f"text is {len(text)} characters; the maximum is {MAX_TEXT_CHARS}")
        k = check_k(k)
        ids = list(sae_ids) if sae_ids else self.sae_ids
        if not ids:
            raise NotFoundError(f"the atlas {self.root} has no SAEs yet")
        hooks = {sid: self.sae_info(sid)["hook"] for sid in ids}
        handle = self.model()
        with self._model_lock, torch.inference_mode():
            tokens = handle.to_tokens(text)
            acts = atlas_sources.run_hooks(handle, tokens, sorted(set(hooks.values())))
            per_sae = {}
            for sid in ids:
                f_TF = self._sae(sid).encode(acts[hooks[sid]][0].float())
                values, latents = f_TF.topk(min(k, f_TF.shape[1]), dim=1)
                per_sae[sid] = [
                    [{"latent": int(i), "act": float(a)} for a, i in zip(v, ix, strict=False) if a > 0]
                    for v, ix in zip(values.tolist(), latents.tolist(), strict=False)
                ]
        ids_T = tokens[0].tolist()
        return TextSearch(text=text, token_ids=ids_T,
                          tokens=handle.tokenizer.convert_ids_to_tokens(ids_T), features=per_sae)

    def contrast(self, texts_a: list[str], texts_b: list[str], *, saes: list[str] | None = None, k: int = 20,
                 pool: Pool = "max", n_permutations: int = 20_000, alpha: float = 0.05,
                 duplicate_threshold: float = 0.9, seed: int = 0) -> ContrastResult:
        """Features that separate two sets of texts (runs the model): each text's activations
        pooled over its tokens (`pool`), per feature the difference of means, AUROC, Cohen's
        d, a permutation p-value and a Benjamini-Hochberg q-value; the best `k`, with
        near-duplicates (decoder cosine >= `duplicate_threshold`) grouped."""
        texts_a = atlas_meaning.check_texts(texts_a, "texts_a", MAX_TEXT_CHARS)
        texts_b = atlas_meaning.check_texts(texts_b, "texts_b", MAX_TEXT_CHARS)
        ids = self._sae_selection(saes)
        result = atlas_meaning.contrast(
            self.model(), {s: self._sae(s) for s in ids}, {s: self.sae_info(s)["hook"] for s in ids},
            texts_a, texts_b, k=check_k(k), pool=pool, n_permutations=n_permutations, alpha=alpha,
            duplicate_threshold=duplicate_threshold, seed=seed, run_locked=self._run_model)
        result.table = self._with_labels(result.table).drop("explanations")
        return result

    def concept_search(self, concept: Any, *, saes: list[str] | None = None, min_fire_rate: float = 0.5,
                       min_selectivity: float = 0.5, target: float = 0.9, max_features: int = 8, seed: int = 0,
                       save: str | None = None) -> ConceptResult:
        """Which features carry a concept (runs the model on its prompts): per SAE the
        features that fire on the concept tokens and vary with the value, the smallest
        group whose decoder span explains `target` of the variation across values, and the
        span's geometry (circle probe, cyclic order and period for an ordered concept;
        held-out LDA accuracy for categories). `concept`: a built-in name (weekdays,
        months, colours), a dict or JSON file (`values`, `templates`, `kind`), or a concept
        object. `save` stores the result as analysis run `concept_search/<save>` and
        rebuilds the geometry records."""
        if not hasattr(concept, "prompts"):
            concept = atlas_meaning.load_concept(concept, categories=True)
        ids = self._sae_selection(saes)
        options = {"min_fire_rate": min_fire_rate, "min_selectivity": min_selectivity, "target": target,
                   "max_features": max_features, "seed": seed}
        result = atlas_meaning.concept_search(
            self.model(), {s: self._sae(s) for s in ids}, {s: self.sae_info(s)["hook"] for s in ids},
            concept, **options, run_locked=self._run_model)
        if save is not None:
            atlas_meaning.save_concept_run(self.root, save, result, {"saes": ids, **options})
            self.rebuild_geometry()
        result.features = self._with_labels(result.features).drop("explanations")
        return result

    def geometry_features(self, sae_id: str | None = None, *, in_circle: bool | None = None,
                          period: float | None = None, lobe: int | None = None, kind: str | None = None) -> pl.DataFrame:
        """Geometry records (circles, concept spans, hierarchy nodes, lobes) of the features
        that pass the filters, e.g. every feature of a period-7 circle: `in_circle=True,
        period=7`. Built from the stored analyses by `rebuild_geometry()`."""
        frames = [atlas_meaning.select_geometry(self._records(sid, "geometry"), int(self.sae_info(sid)["d_sae"]),
                                                in_circle=in_circle, period=period, lobe=lobe, kind=kind)
                  for sid in ([sae_id] if sae_id is not None else self.sae_ids)]
        return pl.concat(frames) if frames else pl.DataFrame()

    def rebuild_geometry(self) -> dict[str, int]:
        """Rewrite every SAE's geometry records from the stored analysis runs; rows per SAE."""
        return atlas_meaning.rebuild_geometry(self.root)

    def build_labels(self, saes: list[str] | None = None) -> dict[str, int]:
        """Compute and store every (or each given) summarized SAE's offline labels; labels per SAE."""
        return {sid: atlas_meaning.build_labels(self.root, sid, self._tables(sid)) for sid in self._sae_selection(saes)}

    def import_explanations(self, sae_id: str, path: str | Path, *, source: str | None = None) -> int:
        """Store explanations for one SAE from a Neuronpedia explanations export (.json) or a
        CSV of feature,explanation; `source` (default: the file name) names the set."""
        path = Path(path)
        return atlas_meaning.import_explanations(self.root, sae_id, path, source or path.stem,
                                                 int(self.sae_info(sae_id)["d_sae"]))

    def search_labels(self, query: str, *, sae_id: str | None = None, k: int = 10) -> pl.DataFrame:
        """Features whose label or imported explanations match `query` (BM25, local): columns
        sae_id, latent, score, label, explanations."""
        k = check_k(k)
        ids = [sae_id] if sae_id is not None else self.sae_ids
        labels = {sid: self._records(sid, "labels") for sid in ids}
        if not any(table.height for table in labels.values()):
            raise NotFoundError(f"no labels or explanations stored for {', '.join(ids) or 'any SAE'}; "
                                f"build them with `sae-atlas search labels --atlas {self.root} --rebuild` "
                                "(summarize does it) or import explanations")
        hits = atlas_meaning.label_index(self._cache, self.root, labels).search(query, k)
        return self._with_labels(hits).with_columns(pl.col("explanations").fill_null([]))

    def _with_labels(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame` (with sae_id, latent) plus `label` (offline) and `explanations` (imported) columns."""
        schema = {"sae_id": pl.String, "latent": pl.Int64, "label": pl.String, "explanations": pl.List(pl.String)}
        wanted = frame.group_by("sae_id").agg("latent").iter_rows() if frame.height else []
        parts = [atlas_meaning.labels_by_latent(self._cache, self.root, sid).filter(pl.col("latent").is_in(latents))
                 .with_columns(pl.lit(sid).alias("sae_id")) for sid, latents in wanted]  # the rows asked for only
        table = pl.concat([p.select(list(schema)) for p in parts]) if parts else pl.DataFrame(schema=schema)
        return frame.join(table, on=["sae_id", "latent"], how="left")

    def _records(self, sae_id: str, table: Any) -> pl.DataFrame:
        self.layout.require_sae(sae_id)
        return atlas_meaning.feature_records(self._cache, self.root, sae_id, table)

    def _sae_selection(self, saes: list[str] | None) -> list[str]:
        ids = list(saes) if saes else self.sae_ids
        if not ids:
            raise NotFoundError(f"the atlas {self.root} has no SAEs yet")
        for sid in ids:
            self.layout.require_sae(sid)
        return ids

    # interventions (api.interventions; the model runs in saes.intervene) ----------------
    def run(self, text: str, edits: list[Any] | None = None, *, sae_ids: list[str] | None = None,
            k: int = 10) -> Any:
        """Run the model on `text` with `sae_ids` (and every SAE an edit names) spliced in,
        error term kept, and `edits` applied (dicts or `saes.intervene.edits` specs):
        next-token predictions vs clean, and each SAE's feature activations."""
        from api import interventions

        return interventions.run(self, text, edits, sae_ids=sae_ids, k=k)

    def steer(self, text: str, edits: list[Any] | None = None, *, sae: str | None = None,
              feature: int | None = None, alpha: float = 4.0, max_new_tokens: int = 20,
              temperature: float = 0.0, seed: int = 0) -> Any:
        """Generate from `text` without and with the edits (or one steer of `sae`/`feature`
        by `alpha` at every position), same seed; the texts and the next-token shift."""
        from api import interventions

        if edits is None and sae is not None and feature is not None:
            edits = [{"kind": "steer", "sae": sae, "feature": feature, "alpha": alpha}]
        return interventions.steer(self, text, edits or [], max_new_tokens=max_new_tokens,
                                   temperature=temperature, seed=seed)

    def attribute(self, text: str, target: Any, *, sae_ids: list[str] | None = None, top: int = 20,
                  verify: int = 5, mode: str = "linearized") -> Any:
        """Activation x gradient attribution of `target` (a token, or `{"kind": "logit" |
        "logit_diff" | "loss", ...}`) to the features of `sae_ids` (default: all) on `text`,
        with the completeness check and the top features' true ablation effects. `mode`:
        "linearized" (parts sum to the target) or "gradient" (the model's own gradient)."""
        from api import interventions

        return interventions.attribute_text(self, text, target, sae_ids=sae_ids, top=top, verify=verify, mode=mode)

    def _run_model(self, run: Any) -> Any:
        """`run()` holding the model lock (one model run at a time per Atlas)."""
        with self._model_lock:
            return run()

    def model(self) -> Any:
        """The atlas's model handle (loaded on first call, then kept)."""
        def load() -> Any:
            spec = self._model_override if self._model_override is not None else self.meta.get("model")
            if spec is None:
                raise NotFoundError(f"{self.layout.atlas_json} records no model spec (key 'model')")
            return spec if hasattr(spec, "bridge") else atlas_sources.load_model(spec)

        return self._cache.get(("model",), load)

    def _token_id(self, token: str | int) -> tuple[int, str | None]:
        if isinstance(token, (int, np.integer)) and not isinstance(token, bool):
            if token < 0:
                raise InvalidInputError(f"token id must be non-negative, got {token}")
            return int(token), None
        if not isinstance(token, str) or not token:
            raise InvalidInputError("token must be a token id or a non-empty string")
        vocab = self._vocab()
        if token not in vocab:  # not seen in any summary: ask the tokenizer (loads the model)
            ids = self.model().tokenizer.convert_tokens_to_ids([token])
            unk = self.model().tokenizer.unk_token_id
            if not ids or ids[0] is None or (ids[0] == unk and token != self.model().tokenizer.unk_token):
                raise NotFoundError(f"token {token!r} is not in the model's vocabulary")
            return int(ids[0]), token
        return vocab[token], token

    def _vocab(self) -> dict[str, int]:
        """Token string -> id, from the token strings of the summaries (examples and logit
        effects), so common lookups need no model."""
        def load() -> dict[str, int]:
            vocab: dict[str, int] = {}
            for sid in self.sae_ids:
                tables = self._tables(sid)
                pairs = [tables.examples.select("token_ids", "tokens").explode("token_ids", "tokens")]
                for side in ("top", "bottom"):
                    pairs.append(tables.features.select(
                        pl.col(f"{side}_logit_ids").alias("token_ids"), pl.col(f"{side}_logit_tokens").alias("tokens")
                    ).explode("token_ids", "tokens"))
                for tid, tok in pl.concat(pairs).drop_nulls().unique().iter_rows():
                    vocab.setdefault(tok, int(tid))
            return vocab

        return self._cache.get(("vocab",), load)

    # maps and geometry --------------------------------------------------------------------
    def map(self, sae_id: str, basis: Basis = "decoder") -> pl.DataFrame:
        """The SAE's 2-D feature map in one basis ("decoder": UMAP of the decoder rows;
        "cooccurrence": UMAP of the activation co-occurrence graph): latent, x, y, knn_overlap,
        and label columns such as cluster when present."""
        return basis_frame(self._stored_map(sae_id)[0], basis)

    def map_scores(self, sae_id: str) -> dict[str, dict[str, float | None]]:
        """Per built map basis: mean kNN overlap on its own neighbours, the chance level, and
        the share of the other basis' neighbours it keeps (`geometry.maps.map_scores`)."""
        return map_scores(*self._stored_map(sae_id))

    def _stored_map(self, sae_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
        self.layout.require_sae(sae_id)
        return self._cache.get(("map", sae_id), lambda: atlas_sources.read_map(self.root, sae_id))

    def analyses(self) -> pl.DataFrame:
        """Stored geometry results: kind, run, table file, figure files, and `status` ("ok", or
        "damaged" with the `problem`: which file, what is wrong, the repair)."""
        runs = atlas_sources.analysis_runs(self.root)
        schema = {"kind": pl.String, "run": pl.String, "table": pl.String, "figures": pl.List(pl.String),
                  "status": pl.String, "problem": pl.String}
        return pl.DataFrame(runs, schema=schema)

    def analysis(self, kind: str, run: str) -> AnalysisResult:
        """One geometry result: its parameters/summary (json), table and figure paths."""
        files, meta, table = atlas_sources.analysis_run(self.root, kind, run)
        folder = self.layout.analysis_dir(kind)
        return AnalysisResult(kind=kind, run=run, meta=meta, table=table,
                              figures=[folder / name for name in files["figures"]])

    def figure_path(self, kind: str, name: str) -> Path:
        """Path of a stored analysis figure (PNG)."""
        return atlas_sources.figure_path(self.root, kind, name)

    def run_circular(self, sae_id: str, *, max_tokens: int = 20_000) -> AnalysisResult:
        """Run circular-feature discovery on one SAE and return the new result."""
        self.layout.require_sae(sae_id)
        files = atlas_sources.run_circular_discovery(self.root, sae_id, max_tokens)
        return self.analysis(files["kind"], files["run"])


def _logits(row: dict[str, Any], side: str) -> list[dict[str, Any]]:
    ids, values = row[f"{side}_logit_ids"] or [], row[f"{side}_logit_values"] or []
    tokens = row[f"{side}_logit_tokens"] or [None] * len(ids)
    return [{"token_id": i, "token": t, "value": v} for i, t, v in zip(ids, tokens, values, strict=False)]


def _vector(values: Any, widths: set[int]) -> np.ndarray:
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
