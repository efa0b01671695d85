"""Every operation of `Atlas` runs over its atlas's one context: with a counting model loader
(`saes.models._resolve`, which builds every model, and no process-wide model cache) each
operation loads a model at most once per context and device, none at all when `Atlas(root, model=handle)` was given;
a second atlas is opened once beside the first and its context used; the model lock is held
while a model runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sae_atlas.api import context
from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services import compare as compare_service
from sae_atlas.api.services import concept_sides
from sae_atlas.saes import models
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.intervene.concepts import weekdays
from sae_atlas.saes.models import tiny_model
from tests.saes.compare_fixtures import one_thread  # noqa: F401

COMPARE = {"n_tokens": 1024, "sample_tokens": 128, "n_perm": 5, "corpus": CorpusSpec(context_size=32)}
CIRCLE = {"n_null": 5, "n_random": 2}
CROSSCODER = {"d_sae": 16, "k": 2, "n_tokens": 512, "batch_size": 256, "corpus": CorpusSpec(context_size=32)}
TINY_B = {"kind": "tiny", "n_layers": 2, "d_model": 32, "seed": 7}


@pytest.fixture(scope="module")
def atlases(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two copies of the small atlas, the first with a stored weekday circle run."""
    base = tmp_path_factory.mktemp("one-context")
    roots = base / "a", base / "b"
    for root in roots:
        shutil.copytree(small_atlas["root"], root)
    handle = tiny_model(n_layers=2, d_model=32)
    write_concept_run(roots[0], "weekdays", run_circle_analysis(handle, weekdays(), [0, 1]), model=handle.name)
    return roots


class NothingKept(dict):
    """A process-wide model cache that keeps nothing: every `load_model` call loads."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every model load anywhere, as its spec: `saes.models._resolve` (which builds every
    model) counted, and `load_model`'s process-wide cache off, so only a context keeps one."""
    seen: list[str] = []
    real = models._resolve

    def counting(spec: Any) -> Any:
        seen.append(json.dumps(spec, sort_keys=True))
        return real(spec)

    monkeypatch.setattr(models, "_resolve", counting)
    monkeypatch.setattr(models, "_LOADED", NothingKept())
    return seen


@pytest.fixture
def locks_checked(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the model lock of the operation's atlas was held each time its model ran."""
    held: list[bool] = []
    stream, concept = compare_service.stream_statistics, concept_sides.concept_feature_acts

    def streaming(*args: Any, **kwargs: Any) -> Any:
        held.append(all(ctx.model_lock.locked() for ctx in ATLASES))
        return stream(*args, **kwargs)

    def concept_acts(*args: Any, **kwargs: Any) -> Any:
        held.append(all(ctx.model_lock.locked() for ctx in ATLASES))
        return concept(*args, **kwargs)

    monkeypatch.setattr(compare_service, "stream_statistics", streaming)
    monkeypatch.setattr(concept_sides, "concept_feature_acts", concept_acts)
    return held


ATLASES: list[context.AtlasContext] = []
"""The contexts whose locks the running operation should hold (set by each test)."""


def test_each_operation_loads_the_model_once_per_context(atlases: tuple[Path, Path], small_atlas: dict[str, Any],
                                                         loads: list[str], locks_checked: list[bool]):
    a, b = small_atlas["sae_ids"]
    hook_a, hook_b = small_atlas["hooks"]
    atlas = Atlas(atlases[0])
    own = json.dumps(atlas.meta["model"], sort_keys=True)
    ATLASES[:] = [atlas.ctx]
    atlas.compare(atlas, sae=a, other_sae=b, run="same-atlas", **COMPARE)
    atlas.emergence([a, b], ["weekdays"], run="series")
    atlas.compare_circle("circular/weekdays", atlases[0], sae=a, other_sae=b, run="circle", **CIRCLE)
    atlas.train_crosscoder(hook_a, hook_b, cc_id="layers", **CROSSCODER)
    atlas.search_text("the cat sat on the mat", k=3)
    assert loads == [own]  # one load for five operations over one context
    atlas.compare_circle("circular/weekdays", sae=a, model_b=json.dumps(TINY_B), hook_b=hook_a, run="in-model",
                         **CIRCLE)
    atlas.train_crosscoder(hook_a, hook_a, model_b=TINY_B, cc_id="models", **CROSSCODER)
    assert loads == [own, json.dumps(TINY_B, sort_keys=True)]  # model B once, then kept by the context
    ATLASES[:] = [atlas.ctx, atlas.ctx.other(atlases[1])]
    atlas.compare(atlases[1], sae=a, other_sae=b, run="two-atlases", **COMPARE)
    atlas.emergence([a, f"{atlases[1]}:{b}"], ["weekdays"], run="two-series")
    assert loads[2:] == [own]  # B's atlas: opened once beside A, its own context, its model loaded once
    assert locks_checked and all(locks_checked)


def test_a_given_model_is_used_and_nothing_is_loaded(atlases: tuple[Path, Path], small_atlas: dict[str, Any],
                                                    loads: list[str], locks_checked: list[bool]):
    a, b = small_atlas["sae_ids"]
    hook_a, hook_b = small_atlas["hooks"]
    handle = tiny_model(n_layers=2, d_model=32)
    loads.clear()  # the given handle's own load
    atlas, other = Atlas(atlases[0], model=handle), Atlas(atlases[1], model=handle)
    ATLASES[:] = [atlas.ctx, other.ctx]
    atlas.compare(other, sae=a, other_sae=b, run="given", **COMPARE)
    atlas.emergence([atlas.sae(a), other.sae(b)], ["weekdays"], run="given-series")
    atlas.compare_circle("circular/weekdays", other, sae=a, other_sae=b, run="given-circle", **CIRCLE)
    atlas.train_crosscoder(hook_a, hook_b, cc_id="given", **CROSSCODER)
    assert loads == [] and all(locks_checked)
    assert atlas.ctx.other(atlases[1]) is atlas.ctx.other(str(atlases[1]))  # a path opened once, then kept
