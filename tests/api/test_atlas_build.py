"""Building an atlas from Python: `Atlas.create` opens a folder that is not an atlas yet
(writing nothing), `cache` creates it with the facade's model, and `summarize` (cached or
streamed), `index` and `build_labels` run over the same context: one model load in all."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sae_atlas.api.atlas import Atlas
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.corpus import CorpusSpec
from tests.api.test_one_context import loads  # noqa: F401  (the counting model loader)

TINY = {"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32}
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
CORPUS = CorpusSpec(context_size=16)


def test_a_new_atlas_is_created_by_its_first_write(tmp_path: Path, loads: list[str]) -> None:  # noqa: F811
    root = tmp_path / "new"
    atlas = Atlas.create(root, model=TINY)
    assert not root.exists() and atlas.meta == {} and atlas.sae_ids == []
    with pytest.raises(NotFoundError, match="not an atlas"):
        Atlas(root)
    with pytest.raises(InvalidInputError, match="tokens"):  # checked before anything runs or is written
        atlas.cache(tokens=0)
    assert not root.exists() and loads == []
    summary = atlas.cache(tokens=256, corpus=CORPUS, device="cpu", progress=False)
    assert summary.hooks == HOOKS and summary.n_tokens == 256 and not summary.already_complete
    assert atlas.meta["model"] == atlas.model().spec and atlas.meta["hooks"] == HOOKS  # re-read after the write
    assert atlas.cache(tokens=256, corpus=CORPUS, device="cpu", progress=False).already_complete
    assert len(loads) == 1  # the facade's model, loaded once for both runs
    again = Atlas.create(root)  # an existing atlas: opened as it is, its recorded model
    assert again.meta == atlas.meta and again.ctx.model_override is None


def test_summaries_indexes_and_labels_run_over_one_context(small_atlas: dict[str, Any], tmp_path: Path,
                                                           loads: list[str]) -> None:  # noqa: F811
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    a, b = small_atlas["sae_ids"]
    atlas = Atlas(root)
    reports = atlas.summarize(force=True, top_k=4, progress=False)
    assert [r.sae_id for r in reports] == [a, b] and all(r.logit_effects and not r.skipped for r in reports)
    assert atlas.summarize([a], top_k=4, progress=False)[0].skipped  # unchanged tables are kept
    streamed = atlas.summarize([b], from_model=True, tokens=320, top_k=4, corpus=CorpusSpec(context_size=32),
                               device="cpu", progress=False)
    assert [r.sae_id for r in streamed] == [b] and 0 < streamed[0].n_tokens <= 320  # BOS left out
    with pytest.raises(InvalidInputError, match="--tokens"):
        atlas.summarize(from_model=True)
    assert {info.get("sae_id") for info in atlas.index(rebuild=True)} == {a, b, None}
    assert set(atlas.build_labels([a])) == {a}
    assert len(loads) == 1  # one model for the logit effects, the stream and nothing else


@pytest.mark.parametrize(("verb", "bad"), [("cache", ["--layers", "0"]), ("summarize", ["--top-k", "0"]),
                                           ("index", ["--approx-threshold", "0"]), ("demo", ["--tokens", "10"]),
                                           ("register", ["--sae", "no-such-sae"])])
def test_the_old_atlas_option_still_names_the_atlas(verb: str, bad: list[str], small_atlas: dict[str, Any]) -> None:
    """`--atlas A` (hidden, deprecated) reaches the same atlas as the first argument: each call
    is refused by that atlas's operation, so nothing is written."""
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    root = str(small_atlas["root"])
    old = CliRunner().invoke(app, [verb, "--atlas", root, *bad])
    new = CliRunner().invoke(app, [verb, root, *bad])
    assert old.exit_code == new.exit_code == 2, (old.output, new.output)
    assert "--atlas is deprecated" in old.output and "--atlas is deprecated" not in new.output
    assert old.output.splitlines()[-1] == new.output.splitlines()[-1]  # the same refusal
    both = CliRunner().invoke(app, [verb, root, "--atlas", root + "-other", *bad])
    assert both.exit_code == 2 and "two atlases given" in both.output
