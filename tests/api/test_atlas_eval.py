"""`Atlas.eval`: the evaluation suite from Python over the facade's context, what the CLI
runs: the results it returns are the ones it stored, the model it runs is the facade's
(loaded once, never again by the suite), and bad parameters are refused by name."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

import sae_atlas.api.context as context
from sae_atlas import Atlas
from sae_atlas.errors import AtlasError
from sae_atlas.saes.eval.evaluate import read_eval
from sae_atlas.saes.eval.results import read_result


@pytest.fixture
def atlas(small_atlas: dict[str, Any], tmp_path: Path) -> Atlas:
    root = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], root)
    return Atlas(root)


def test_eval_stores_what_it_returns_and_runs_the_facades_model(atlas: Atlas,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Any] = []
    real = context.load_model
    monkeypatch.setattr(context, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    handle = atlas.model()
    done = atlas.eval(suite="core,mdl", tokens=256, ce_blocks=2, force=True)
    assert done is not None and loads == [loads[0]] and atlas.model() is handle  # one load, the facade's
    assert set(done.core) == set(done.results) == set(atlas.sae_ids)
    for sae_id in atlas.sae_ids:
        assert done.core[sae_id] == read_eval(atlas.root, sae_id)
        assert done.core[sae_id]["metrics"]["ce_loss_score"] is not None  # the model ran
        for name in ("core", "mdl"):
            assert done.results[sae_id][name] == read_result(atlas.root, sae_id, name)
    again = atlas.eval(saes=atlas.sae_ids[:1], suite=["mdl"], tokens=256)
    assert again is not None and again.kept == [(atlas.sae_ids[0], "mdl")]  # finished results are kept
    assert again.to_dict() == {atlas.sae_ids[0]: {"mdl": done.results[atlas.sae_ids[0]]["mdl"]}}


def test_eval_refuses_bad_parameters_by_name_and_takes_the_old_names(atlas: Atlas) -> None:
    for bad, needle in (({"tokens": 0}, "tokens"), ({"suite": "core,nope"}, "unknown eval 'nope'"),
                        ({"saes": ["no-such-sae"]}, "no-such-sae"),
                        ({"suite": "sparse_probing", "no_model": True}, "drop --no-model"),
                        ({"suite": "ground_truth"}, "ground_truth")):
        with pytest.raises(AtlasError, match=needle):  # NotFoundError for the SAE, else InvalidInputError
            atlas.eval(**bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = atlas.eval(suite="mdl", n_tokens=128, sae_ids=atlas.sae_ids[:1])
    assert done is not None and list(done.results) == atlas.sae_ids[:1]
    assert {str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)} >= {
        "EvalParams: 'n_tokens' is deprecated, use 'tokens'", "EvalParams: 'sae_ids' is deprecated, use 'saes'"}
