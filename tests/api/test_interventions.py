"""Interventions through the Atlas facade, the CLI and the real HTTP server (small atlas)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from sae_atlas.api.analyses.circular import (
    read_circle_plane,
    run_circle_analysis,
    write_concept_run,
)
from sae_atlas.api.atlas import Atlas
from sae_atlas.api.bounds import MAX_EDITS, MAX_PROMPT_TOKENS
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.intervene.concepts import weekdays
from tests.api.conftest import LiveServer
from tests.api.test_browser import CHROMIUM_ARGS, _chromium

TEXT = "the cat sat on the mat"
RUN = "weekdays-tiny"


@pytest.fixture(scope="module")
def atlas_dir(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas with a stored weekday concept run (circle planes)."""
    root = tmp_path_factory.mktemp("interventions") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    atlas = Atlas(root)
    analysis = run_circle_analysis(atlas.model(), weekdays(), [0, 1], n_components=4)
    write_concept_run(root, RUN, analysis, model="tiny")
    return {**small_atlas, "root": root, "analysis": analysis}


@pytest.fixture(scope="module")
def atlas(atlas_dir: dict[str, Any]) -> Atlas:
    return Atlas(atlas_dir["root"])


def _firing(atlas: Atlas, sae_id: str) -> int:
    """A feature of `sae_id` active at the last token of TEXT."""
    out = atlas.run(TEXT, saes=[sae_id])
    return int(out.codes[sae_id][-1].argmax())


def test_run_without_edits_matches_the_clean_model(atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][0]
    out = atlas.run(TEXT, saes=[sid])
    assert out.kl == pytest.approx(0.0, abs=1e-9)
    assert all(abs(t["p_edited"] - t["p_clean"]) < 1e-5 for t in out.next_tokens)
    assert out.codes[sid].shape == (len(out.tokens), atlas_dir["d_sae"])
    assert out.features[sid][-1] and out.to_dict()["features"][sid][-1][0]["act"] > 0


def test_edits_move_the_prediction_and_ablation_uses_the_mean(atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][1]
    f = _firing(atlas, sid)
    steered = atlas.run(TEXT, [{"kind": "steer", "sae": sid, "feature": f, "alpha": 25.0, "at": "last"}])
    assert steered.kl > 1e-3
    zero = atlas.run(TEXT, [{"kind": "ablate", "sae": sid, "feature": f}])
    mean = atlas.run(TEXT, [{"kind": "ablate", "sae": sid, "feature": f, "to": "mean"}])
    mean_act = atlas.feature(sid, f).stats["mean_act"]
    assert float(zero.codes[sid][-1, f]) == 0.0
    assert float(mean.codes[sid][-1, f]) == pytest.approx(mean_act, rel=1e-5)
    clamp = atlas.run(TEXT, [{"kind": "clamp", "sae": sid, "feature": f, "value": 3.0, "at": [1, 2]}])
    assert clamp.codes[sid][[1, 2], f].tolist() == [3.0, 3.0]
    assert "<table" in steered._repr_html_()


def test_steer_is_seeded_and_shows_both_texts(atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][1]
    f = _firing(atlas, sid)
    a = atlas.steer(TEXT, saes=[sid], feature=f, alpha=30.0, max_new_tokens=5, temperature=1.0, seed=7)
    b = atlas.steer(TEXT, saes=[sid], feature=f, alpha=30.0, max_new_tokens=5, temperature=1.0, seed=7)
    assert a.to_dict() == b.to_dict()
    assert a.kl > 0 and len(a.edited_ids) == 5
    html = a._repr_html_()
    assert "baseline" in html and "edited" in html and "rising" in html


def test_attribution_is_complete_and_checked(atlas, atlas_dir):
    result = atlas.attribute(TEXT, {"kind": "logit", "token": "dog"}, verify=3)
    assert result.complete
    assert {p["sae_id"] for p in result.parts} == set(atlas_dir["sae_ids"])
    assert len(result.verification) == 3 and "sign_agreement" in result.agreement
    assert len(result.token_attr[atlas_dir["sae_ids"][0]]) == len(result.tokens)
    assert "rgba(" in result._repr_html_()
    loss = atlas.attribute(TEXT, {"kind": "loss"}, verify=0)
    assert loss.complete and loss.total > 0


def test_rotate_reads_the_stored_circle_plane(atlas, atlas_dir):
    analysis = atlas_dir["analysis"]
    plane = read_circle_plane(atlas.root, RUN, 1)
    probe = analysis.probes[1]
    assert plane.hook == "blocks.1.hook_resid_post" and plane.period == 7
    assert np.allclose(plane.basis_D2, probe.plane_D2) and np.allclose(plane.A_22, probe.circle_A_22)
    text = "let's do some days of the week math. two days from monday is"
    at = {"match": "monday"}
    clean = atlas.run(text)
    moved = {b: atlas.run(text, [{"kind": "rotate", "circle": RUN, "layer": 0, "steps": 2, "at": at,
                                  "baseline": b}]) for b in ("circle", "random_plane", "mean_ablation")}
    for out in moved.values():
        assert out.kl > 0
    assert clean.kl == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(NotFoundError, match="did not probe layer 5"):
        atlas.run(text, [{"kind": "rotate", "circle": RUN, "layer": 5, "at": at}])
    with pytest.raises(NotFoundError, match="no circular analysis run"):
        atlas.run(text, [{"kind": "rotate", "circle": "nope", "at": at}])


def test_bad_requests_are_named(atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][0]
    with pytest.raises(NotFoundError, match="unknown SAE|no SAE"):
        atlas.run(TEXT, [{"kind": "steer", "sae": "nope", "feature": 0, "alpha": 1.0}])
    with pytest.raises(NotFoundError, match="out of range"):
        atlas.run(TEXT, [{"kind": "steer", "sae": sid, "feature": 10_000, "alpha": 1.0}])
    with pytest.raises(InvalidInputError, match="at most"):
        atlas.run(TEXT, [{"kind": "scale", "sae": sid, "feature": 0, "factor": 1.0}] * (MAX_EDITS + 1))
    with pytest.raises(InvalidInputError, match="teleport"):
        atlas.run(TEXT, [{"kind": "teleport", "sae": sid, "feature": 0}])
    with pytest.raises(InvalidInputError, match="maximum is"):
        atlas.run(" ".join(["cat"] * (MAX_PROMPT_TOKENS + 5)))
    with pytest.raises(InvalidInputError, match="no prompt token matches"):
        atlas.run(TEXT, [{"kind": "ablate", "sae": sid, "feature": 0, "at": {"match": "zebra"}}])
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        atlas.steer(TEXT, saes=[sid], feature=0, max_new_tokens=10_000)


def test_cli_steer_and_attribute(atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][1]
    f = _firing(atlas, sid)
    runner = CliRunner()
    res = runner.invoke(app, ["steer", str(atlas.root), TEXT, "--sae", sid, "--feature", str(f), "--alpha", "30",
                              "--max-new-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["kl"] > 0 and len(body["edited_ids"]) == 4
    res = runner.invoke(app, ["steer", str(atlas.root), TEXT, "--edit", "{not json"])
    assert res.exit_code != 0 and "not valid JSON" in res.output
    res = runner.invoke(app, ["attribute", str(atlas.root), TEXT, "--target", "dog", "--verify", "2"])
    assert res.exit_code == 0, res.output
    assert "completeness" in res.output and "True" in res.output


# ---------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def live(atlas_dir: dict[str, Any]):
    with LiveServer(atlas_dir["root"], allow_interventions=True) as server:
        yield server


def test_http_run_steer_attribute(live, atlas, atlas_dir):
    sid = atlas_dir["sae_ids"][1]
    f = _firing(atlas, sid)
    r = httpx.post(live.url + "/run", json={"text": TEXT, "saes": [sid]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["kl"] == pytest.approx(0.0, abs=1e-9) and set(r.json()["features"]) == {sid}
    every = httpx.post(live.url + "/run", json={"text": TEXT}, timeout=60).json()  # saes' default: every SAE
    assert set(every["features"]) == set(atlas_dir["sae_ids"])
    old = httpx.post(live.url + "/run", json={"text": TEXT, "sae_ids": [sid]}, timeout=60)  # the old name, still taken
    assert old.status_code == 200 and set(old.json()["features"]) == {sid}
    r = httpx.post(live.url + "/steer", json={"text": TEXT, "max_new_tokens": 3,
                                              "edits": [{"kind": "steer", "sae": sid, "feature": f, "alpha": 30}]},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["edited_ids"]) == 3 and r.json()["kl"] > 0
    r = httpx.post(live.url + "/attribute", json={"text": TEXT, "target": "dog", "verify": 2}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["complete"] is True and r.json()["features"]
    r = httpx.post(live.url + "/attribute", json={"text": TEXT, "target": "dog", "verify": 2, "mode": "gradient"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["mode"] == "gradient"


@pytest.mark.parametrize("path,body,status,needle", [
    ("/run", {"text": "x" * 100_000}, 422, "text"),
    ("/run", {"text": " ".join(["cat"] * (MAX_PROMPT_TOKENS + 5))}, 400, "maximum is"),
    ("/run", {"text": TEXT, "edits": [{"kind": "steer", "sae": "nope", "feature": 0, "alpha": 1}]}, 404, "nope"),
    ("/run", {"text": TEXT, "edits": [{"kind": "steer", "sae": "SID", "feature": 99999, "alpha": 1}]}, 404,
     "out of range"),
    ("/run", {"text": TEXT, "edits": [{"kind": "scale", "sae": "SID", "feature": 0, "factor": 1}] * (MAX_EDITS + 1)},
     422, "at most"),
    ("/run", {"text": TEXT, "edits": [{"kind": "teleport", "sae": "SID", "feature": 0}]}, 422, "teleport"),
    ("/steer", {"text": TEXT, "max_new_tokens": 10_000,
                "edits": [{"kind": "steer", "sae": "SID", "feature": 0, "alpha": 1}]}, 422, "max_new_tokens"),
    ("/attribute", {"text": TEXT, "target": "the cat"}, 400, "exactly one token"),
    ("/attribute", {"text": TEXT, "target": "dog", "mode": "magic"}, 422, "mode"),
])
def test_http_bad_input(live, atlas_dir, path, body, status, needle):
    body = json.loads(json.dumps(body).replace("SID", atlas_dir["sae_ids"][0]))
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]


def test_http_interventions_are_off_by_default(server):
    r = httpx.post(server.url + "/run", json={"text": TEXT}, timeout=30)
    assert r.status_code == 403 and "--allow-interventions" in r.json()["detail"]


# ---------------------------------------------------------------- explorer


@pytest.fixture(scope="module")
def browser_page(atlas_dir: dict[str, Any]) -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    executable = _chromium()
    with LiveServer(atlas_dir["root"], allow_interventions=True) as live, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.errors = errors
        page.url_base = live.url
        yield page
        browser.close()


def test_explorer_steer_box_and_attribution_view(browser_page: Any, atlas_dir: dict[str, Any]) -> None:
    page = browser_page
    sae = atlas_dir["sae_ids"][1]
    page.goto(f"{page.url_base}/#/saes/{sae}/features/3")
    page.wait_for_selector("#steer-box")
    page.fill("#steer-prompt", "the cat sat on the mat")
    page.fill("#steer-alpha", "40")
    page.fill("#steer-tokens", "4")
    page.click("#steer-run")
    page.wait_for_selector("#steer-result table")
    rows = page.locator("#steer-result table").first.inner_text()
    assert "baseline" in rows and "edited" in rows
    page.goto(f"{page.url_base}/#/attribute")
    page.wait_for_selector("#attr-text")
    page.fill("#attr-text", "the cat sat on the mat")
    page.fill("#attr-target", "dog")
    page.click("#attr-run")
    page.wait_for_selector("#attr-complete")
    assert page.inner_text("#attr-complete") == "complete"
    assert page.locator(".attr-row").count() == len(atlas_dir["sae_ids"])
    assert page.locator(".attr-row span.t").count() == 2 * 7  # BOS + 6 tokens per SAE
    page.fill("#attr-target", "the cat")
    page.click("#attr-run")
    page.wait_for_selector("#attr-results .error")
    assert "exactly one token" in page.inner_text("#attr-results .error")
    assert page.errors == []


def test_a_target_missing_its_token_is_named() -> None:
    """A target the model cannot resolve is refused with the rule it breaks, in words."""
    from sae_atlas.api.operations.interventions import AttributeParams

    for target, message in (({"kind": "logit", "token": None}, "target.*a logit target needs a token"),
                            ({"kind": "logit_diff", "token": "cat"}, "target.*a logit_diff target needs 'other'"),
                            ("", "target.*at least 1 character")):
        with pytest.raises(InvalidInputError, match=message):
            AttributeParams.of(text=TEXT, target=target)


def test_steer_parameters_name_what_is_wrong_and_take_the_old_names() -> None:
    """A feature steers with exactly one SAE of `saes`; a steer needs an edit or a feature; the
    old `sae` (one id) is still taken, with a warning, and becomes the feature's steer."""
    from sae_atlas.api.operations.interventions import RunParams, SteerParams
    from sae_atlas.saes.intervene.edits import ClampEdit, SteerEdit, TokenMatch

    with pytest.raises(InvalidInputError, match="feature: a feature steers with the one SAE in saes"):
        SteerParams.of(text=TEXT, feature=1, saes=["a", "b"])
    with pytest.raises(InvalidInputError, match="edits: steer needs at least one edit"):
        SteerParams.of(text=TEXT)
    with pytest.warns(DeprecationWarning, match="'sae' is deprecated, use 'saes'"):
        params = SteerParams.of(text=TEXT, sae=["x"], feature=2, at="last")
    assert params.core_edits() == [SteerEdit(sae="x", feature=2, alpha=4.0, at="last")]
    core = ClampEdit(sae="x", feature=1, value=2.0, at=TokenMatch("cat"))  # the core's edits are taken as they are
    assert RunParams.of(text=TEXT, edits=[core]).core_edits() == [core]
