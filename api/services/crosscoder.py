"""Training a crosscoder on two models (or two hooks of one model) streamed at the same
tokens, stored in atlas A: the weights in `crosscoders/<id>/` (SAELens layout + its
`crosscoder.json`, resumable after a kill) and each latent's relative decoder norm as the
analysis run `analyses/crosscoder/<id>`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from api.results.analysis import AnalysisResult
from api.services.analyses import analysis
from geometry.results import write_analysis
from saes.compare.crosscoder import paired_batches, relative_norms, train_crosscoder
from saes.compare.pairs import Side, paired_activations
from saes.corpus import CorpusSpec
from saes.models import load_model, normalize_spec
from saes.train.config import TrainConfig
from store.errors import InvalidInputError
from store.layout import AtlasLayout, check_id

KIND = "crosscoder"


def crosscoder_dir(root: str | Path, cc_id: str) -> Path:
    """Where crosscoder `cc_id` of the atlas lives: `crosscoders/<id>/`."""
    return AtlasLayout(root).root / "crosscoders" / check_id(cc_id, "crosscoder id")


def run_train_crosscoder(
    root: str | Path, hook_a: str, hook_b: str, *, model_b: str | dict[str, Any] | None = None, d_sae: int = 4096,
    k: int = 32, n_tokens: int = 200_000, pass_tokens: int | None = None, batch_size: int = 1024,
    corpus: CorpusSpec | None = None, batch_blocks: int = 8, device: str = "cpu", cc_id: str | None = None,
    seed: int = 0, progress: bool = True,
) -> AnalysisResult:
    """Train a crosscoder between `hook_a` of the atlas's model and `hook_b` of `model_b`
    (default: the same model) on `n_tokens` training tokens, streamed in passes of
    `pass_tokens` corpus tokens (default `n_tokens`), and store it with its relative norms."""
    layout = AtlasLayout(root)
    spec_a = layout.read_meta().get("model")
    if spec_a is None:
        raise InvalidInputError(f"{layout.atlas_json} records no model; a crosscoder needs the atlas's model")
    handle_a = load_model(spec_a, device=device)
    handle_b = load_model(normalize_spec(model_b), device=device) if model_b else handle_a
    if handle_a is handle_b and hook_a == hook_b:
        raise InvalidInputError(f"both sides read {hook_a!r} of one model; name two hooks or a second model")
    a, b = Side(handle_a, handle_a.check_hook(hook_a)), Side(handle_b, handle_b.check_hook(hook_b))
    corpus = corpus or CorpusSpec()
    cc_id = check_id(cc_id or f"{hook_a}--{hook_b}-{d_sae}", "crosscoder id")

    def one_pass(epoch: int) -> Iterator[torch.Tensor]:
        rows = (torch.cat([p.a_ND.float().cpu(), p.b_ND.float().cpu()], dim=1)
                for p in paired_activations(a, b, corpus, n_tokens=pass_tokens or n_tokens,
                                            batch_blocks=batch_blocks, progress=False))
        return paired_batches(rows, batch_size, seed=seed + epoch)

    def paired(skip: int) -> Iterator[torch.Tensor]:
        return itertools.islice(itertools.chain.from_iterable(one_pass(e) for e in itertools.count()), skip, None)

    sides = {"model_a": handle_a.name, "hook_a": hook_a, "model_b": handle_b.name, "hook_b": hook_b,
             "spec_b": model_b}
    cfg = TrainConfig(total_tokens=n_tokens, batch_size=batch_size, seed=seed, device=device, progress=progress)
    result, scales = train_crosscoder(paired, handle_a.d_model, handle_b.d_model, d_sae=d_sae, k=k, train_cfg=cfg,
                                      out_dir=crosscoder_dir(root, cc_id), sides=sides)
    norms = relative_norms(result.sae, handle_a.d_model)
    table = pl.DataFrame({"latent": np.arange(d_sae, dtype=np.int32), "norm_a": norms.norm_a, "norm_b": norms.norm_b,
                          "relative_norm": norms.relative, "latent_class": norms.latent_class})
    counts = {c: int((norms.latent_class == c).sum()) for c in ("a_only", "shared", "b_only")}
    summary = {**counts, "scale_a": scales.scale_a, "scale_b": scales.scale_b,
               **{k_: v for k_, v in result.final_metrics.items() if isinstance(v, float | int)}}
    params = {**sides, "d_sae": d_sae, "k": k, "n_tokens": n_tokens, "pass_tokens": pass_tokens or n_tokens,
              "batch_size": batch_size, "corpus": corpus.__dict__, "seed": seed, "folder": f"crosscoders/{cc_id}"}
    write_analysis(root, KIND, cc_id, parameters=params, summary=summary, tables={"main": table})
    return analysis(Path(root), KIND, cc_id)
