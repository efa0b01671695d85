"""What the Depth page and the feature page read of stored depth runs, over HTTP and from
Python: `GET /depth` lists runs with their status, `GET /depth/<run>` sends the typed run
(profile, CKA matrix, trajectory distributions and extremes, joined features; a families run's
means and tests), and a feature of a joined SAE says where it fires in depth terms. A planted
join (one feature's tokens far below its layer's local dimension, one far above, one typical)
must read as compressing / expanding / typical, for its own SAE only; a damaged run is listed
as damaged and left off the feature page. The explorer's Depth page and the feature page's
depth card in headless Chromium draw what the service sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from pydantic import TypeAdapter
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.api.http.json_body import dumps
from sae_atlas.api.results.depth import DepthRun, DepthRunRow
from sae_atlas.store.analysis_runs import write_analysis
from tests.api.conftest import LiveServer
from tests.api.test_browser import ARTIFACTS, _page, browser  # noqa: F401 (the browser fixture)

TINY = '{"kind": "tiny", "arch": "llama", "n_layers": 4, "seed": 3}'
TINY_B = '{"kind": "tiny", "arch": "llama", "n_layers": 4, "seed": 4}'
HOOK = "blocks.2.hook_resid_post"
SMALL = ["--context", "32", "--tokens", "256", "--batch-blocks", "2", "--max-points", "150", "--k", "10",
         "--device", "cpu"]
FAMILIES = {"animals": ["the cat sat on the mat", "a dog ran to the house", "the bird sat in the tree"],
            "numbers": ["one two three four", "five six seven eight", "nine ten eleven twelve"]}
PLANTED = {1: (-4.5, 3.0, 0.1), 2: (0.3, 0.0, 0.0), 3: (5.0, 0.0, -2.5)}  # feature: lid, convergence, curvature z
EXTREME = {"block": 3, "position": 2, "token": 42, "convergence_index": 0.1, "text": " cat", "context": "the cat"}


def _invoke(*args: str) -> None:
    out = CliRunner().invoke(app, ["analyze", "depth", *args])
    assert out.exit_code == 0, out.output


def planted_run(root: Path, sae_id: str, run: str = "planted") -> None:
    """A depth run of every table column but few rows, whose `features` table joins `sae_id`
    at layer 2 with the PLANTED z-scores (local dimension 7.5 + z against 7.5 over all tokens),
    and one feature of another SAE (the fuzz atlas serves it too)."""
    layers = [0, 1, 2, 3]
    main = pl.DataFrame({"layer": layers, "twonn": [4.0, 6.0, 5.0, 3.0], "mle": [4.5, 6.5, 5.5, 3.5],
                         "mle_low": [4.0, 6.0, 5.0, 3.0], "mle_high": [5.0, 7.0, 6.0, 4.0],
                         "lid_mean": [2.0, 4.0, 7.5, 2.0], "lid_q10": [1.0, 2.0, 5.0, 1.0],
                         "lid_q50": [2.0, 4.0, 7.5, 2.0], "lid_q90": [3.0, 6.0, 10.0, 3.0],
                         "step_length": [None, 1.0, 1.0, 1.0], "curvature": [None, None, 0.5, 0.5],
                         "consecutive_cosine": [None, 0.9, 0.9, 0.9], "cosine_to_final": [0.5, 0.7, 0.9, 1.0],
                         "tuned_fit_loss": [0.5, 0.3, 0.1, 0.0],
                         **{f"{lens}_{metric}": values for lens in ("logit", "tuned") for metric, values in
                            (("top1", [0.1, 0.4, 0.8, 1.0]), ("kl", [3.0, 2.0, 0.5, 0.0]),
                             ("median_rank", [50.0, 10.0, 1.0, 0.0]))}})
    rows = [{"sae_id": sae_id, "feature": f, "n_fires": 12, "lid_mean": 7.5 + z, "lid_shift": z, "lid_z": z,
             "convergence_index_mean": 0.5, "convergence_index_shift": 0.1, "convergence_index_z": cz,
             "curvature_mean": 1.0, "curvature_shift": 0.0, "curvature_z": kz} for f, (z, cz, kz) in PLANTED.items()]
    rows.append({**rows[0], "sae_id": "another-sae", "feature": 2, "lid_z": -9.0})
    write_analysis(root, "depth", run, parameters={"model": "tiny", "layers": layers, "sae_ids": [sae_id]},
                   summary={"layers": layers, "n_tokens": 100, "n_subsampled": 50, "id_peak_layer": 1,
                            "extreme_tokens": {"lowest_convergence": [EXTREME], "highest_curvature": []}},
                   tables={"main": main, "cka": pl.DataFrame([{"layer_a": a, "layer_b": b, "cka": float(a == b)}
                                                for a in layers for b in layers]),
                           "features": pl.DataFrame(rows)})


@pytest.fixture(scope="module")
def depth_atlas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 4-layer tiny model's atlas with one summarized SAE at layer 2, a corpus depth run
    joining it (`depth`), a families run (`depth-families`), a run against another tiny model
    (`depth-pair`) and the planted join (`planted`)."""
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import tiny_model
    from sae_atlas.saes.summary.run import summarize_sae
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    root = tmp_path_factory.mktemp("depth") / "atlas"
    handle = tiny_model(arch="llama", n_layers=4, seed=3)
    cache_activations(handle, root, [HOOK], corpus=CorpusSpec(context_size=32), n_tokens=32 * 16, progress=False)
    trained = train_saes(root, [HOOK], architecture="topk", d_sae=64, k=4,
                         train_cfg=TrainConfig(total_tokens=256 * 4, batch_size=256, progress=False))
    sae_id = trained[HOOK]["sae_id"]
    summarize_sae(root, sae_id, W_U=handle.W_U.detach(), final_norm_weight=handle.final_norm_weight,
                  norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer, top_k=4, window=(4, 1),
                  progress=False)
    _invoke(str(root), "--model", TINY, "--sae", sae_id, *SMALL)
    families = root.parent / "families.json"
    families.write_text(json.dumps({"families": FAMILIES}))
    _invoke(str(root), "--model", TINY, "--families", str(families), "--k", "5", "--n-permutations",
            "100", "--device", "cpu")
    _invoke(str(root), "--model", TINY, "--model-b", TINY_B, "--n-permutations", "50", "--mle-k", "8",
            *SMALL)
    planted_run(root, sae_id)
    return {"root": root, "sae_id": sae_id}


@pytest.fixture(scope="module")
def client(depth_atlas: dict[str, Any]) -> Any:
    with TestClient(create_app(ServerSettings(root=depth_atlas["root"]))) as c:
        yield c


def _valid(body: Any, result_type: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(body, TypeAdapter(result_type).json_schema(mode="serialization"))


def test_listing_names_each_run_its_kind_and_status(client: Any, depth_atlas: dict[str, Any]) -> None:
    rows = client.get("/depth").json()
    _valid(rows, list[DepthRunRow])
    by_run = {r["run"]: r for r in rows}
    assert set(by_run) == {"depth", "depth-families", "depth-pair", "planted"}
    assert by_run["depth-pair"]["kind"] == "pair" and by_run["depth-pair"]["model_b"] is not None
    assert by_run["depth"]["kind"] == "corpus" and by_run["depth"]["layers"] == [0, 1, 2, 3]
    assert by_run["depth"]["sae_ids"] == [depth_atlas["sae_id"]] and by_run["depth"]["n_tokens"] > 0
    assert by_run["depth-families"]["kind"] == "families" and by_run["depth-families"]["families"] == list(FAMILIES)
    assert all(r["status"] == "ok" and r["problem"] is None for r in rows)
    assert rows == json.loads(dumps(Atlas(depth_atlas["root"]).depth_runs()))


def test_corpus_run_sends_profile_cka_distributions_and_extremes(client: Any, depth_atlas: dict[str, Any]) -> None:
    body = client.get("/depth/depth").json()
    _valid(body, DepthRun)
    assert body == json.loads(dumps(Atlas(depth_atlas["root"]).depth_run("depth").to_dict()))
    assert body["kind"] == "corpus" and body["layers"] == [0, 1, 2, 3]
    profile = body["profile"]
    assert [r["layer"] for r in profile] == [0, 1, 2, 3]
    assert all(r["mle_low"] <= r["mle"] <= r["mle_high"] and r["lid_q10"] <= r["lid_q50"] <= r["lid_q90"]
               for r in profile)
    assert profile[-1]["logit_top1"] == 1.0 and profile[0]["step_length"] is None  # columns pass through as stored
    cka = np.array(body["cka"]["values"])
    assert body["cka"]["layers"] == [0, 1, 2, 3] and np.allclose(cka, cka.T) and np.allclose(np.diag(cka), 1.0)
    n = body["summary"]["n_subsampled"]
    for name in ("convergence_index", "mean_curvature", "path_length"):
        d = body["distributions"][name]
        assert len(d["edges"]) == len(d["counts"]) + 1 and d["edges"][0] <= d["median"] <= d["edges"][-1]
    assert sum(body["distributions"]["path_length"]["counts"]) == n == 150
    extremes = body["extreme_tokens"]
    assert [e["metric"] for e in extremes] == ["convergence_index"] * 5 + ["mean_curvature"] * 5
    lowest = [e["value"] for e in extremes[:5]]
    assert lowest == sorted(lowest) and lowest[0] == pytest.approx(body["distributions"]["convergence_index"]["edges"][0])
    assert sorted(body["figures"]) == ["depth.cka.png", "depth.profile.png", "depth.trajectories.png"]


def test_joined_features_are_the_extremes_of_local_dimension(client: Any, depth_atlas: dict[str, Any]) -> None:
    body = client.get("/depth/depth").json()
    folder = depth_atlas["root"] / "analyses" / "depth"
    table = pl.read_parquet(folder / "depth.features.parquet")
    zs = sorted(table.filter(pl.col("lid_z").is_finite())["lid_z"].to_list())
    features = body["features"]
    assert features and {f["sae_id"] for f in features} == {depth_atlas["sae_id"]}
    assert all(f["layer"] == 2 and f["run"] == "depth" for f in features)
    assert features[0]["lid_z"] == pytest.approx(zs[0]) and max(f["lid_z"] for f in features) == pytest.approx(zs[-1])
    for f in features:
        expected = "compressing" if f["lid_z"] <= -2 else "expanding" if f["lid_z"] >= 2 else "typical"
        assert f["shape"] == expected and f"at layer 2 its {f['n_fires']} tokens" in f["says"]


def test_families_run_sends_means_per_family_and_tests(client: Any) -> None:
    body = client.get("/depth/depth-families").json()
    _valid(body, DepthRun)
    assert body["kind"] == "families" and body["profile"] == [] and body["cka"] is None
    assert [f["family"] for f in body["families"]] == list(FAMILIES)
    assert all(f["n_prompts"] == 3 and len(f["lid"]) == len(body["layers"]) == 4 for f in body["families"])
    tests = body["family_tests"]
    assert {(t["family_a"], t["family_b"]) for t in tests} == {("animals", "numbers")}
    assert [t["p_value"] for t in tests] == sorted(t["p_value"] for t in tests)
    assert {"convergence_index", "lid_2"} <= {t["metric"] for t in tests}


def test_pair_run_sends_cross_cka_and_shift(client: Any) -> None:
    body = client.get("/depth/depth-pair").json()
    _valid(body, DepthRun)
    assert body["kind"] == "pair" and body["profile"] == [] and body["families"] == []
    cka = np.array(body["cka"]["values"])
    assert body["cka"]["layers"] == body["cka"]["layers_b"] == [0, 1, 2, 3] and cka.shape == (4, 4)
    assert np.isfinite(cka).all() and (cka <= 1 + 1e-6).all()
    shift = body["shift"]
    assert [r["layer"] for r in shift] == [0, 1, 2, 3]
    assert all(r["mle_shift_low"] <= r["mle_shift_high"] and 0 < r["lid_shift_p"] <= 1 for r in shift)
    assert all(r["mle_shift"] == pytest.approx(r["mle_b"] - r["mle_a"]) for r in shift)


def test_unknown_run_is_a_404_naming_the_runs(client: Any) -> None:
    answer = client.get("/depth/nope")
    assert answer.status_code == 404 and "depth-families" in answer.json()["detail"]


def test_feature_page_says_where_the_feature_fires_in_depth(client: Any, depth_atlas: dict[str, Any]) -> None:
    sae_id = depth_atlas["sae_id"]
    atlas = Atlas(depth_atlas["root"])
    pages = {f: atlas.feature(sae_id, f) for f in (1, 2, 3, 4)}
    planted = {f: [d for d in page.depth if d["run"] == "planted"] for f, page in pages.items()}
    assert planted[4] == []  # not in the planted join
    assert [planted[f][0]["shape"] for f in (1, 2, 3)] == ["compressing", "typical", "expanding"]
    one = planted[1][0]
    assert one["layer"] == 2 and one["lid_all"] == pytest.approx(7.5) and one["lid_mean"] == pytest.approx(3.0)
    assert one["says"].startswith("fires where the representation is compressing: at layer 2 its 12 tokens have "
                                  "local dimension 3 against 7.5 over all tokens (z = -4.5; the layer's 10-90% "
                                  "range 5-10)")
    assert "point their final way earlier than most tokens (convergence z = 3)" in one["says"]
    assert "turn less than most (curvature z = -2.5)" in planted[3][0]["says"]
    assert "turn" not in planted[2][0]["says"] and "final way" not in planted[2][0]["says"]
    # the real join, for a feature in its table: the run's own numbers
    joined = pl.read_parquet(depth_atlas["root"] / "analyses" / "depth" / "depth.features.parquet")
    row = joined.sort("lid_z").row(0, named=True)
    real = [d for d in atlas.feature(sae_id, row["feature"]).depth if d["run"] == "depth"]
    assert len(real) == 1 and real[0]["lid_z"] == pytest.approx(row["lid_z"]) and real[0]["n_fires"] == row["n_fires"]
    # over HTTP, the same
    answer = client.get(f"/saes/{sae_id}/features/1").json()
    assert [d for d in answer["depth"] if d["run"] == "planted"] == json.loads(dumps(planted[1]))


def test_a_damaged_run_is_listed_and_left_off_the_feature_page(client: Any, depth_atlas: dict[str, Any]) -> None:
    root, sae_id = depth_atlas["root"], depth_atlas["sae_id"]
    table = root / "analyses" / "depth" / "planted.features.parquet"
    saved = table.read_bytes()
    try:
        table.write_bytes(b"broken")
        rows = {r["run"]: r for r in client.get("/depth").json()}
        assert rows["planted"]["status"] == "damaged" and "planted.features.parquet" in rows["planted"]["problem"]
        answer = client.get(f"/saes/{sae_id}/features/1")
        assert answer.status_code == 200 and all(d["run"] != "planted" for d in answer.json()["depth"])
        broken = client.get("/depth/planted")
        assert broken.status_code == 500 and "planted.features.parquet" in broken.json()["detail"]
    finally:
        table.write_bytes(saved)
    assert any(d["run"] == "planted" for d in client.get(f"/saes/{sae_id}/features/1").json()["depth"])


def test_openapi_documents_the_depth_routes(client: Any) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, name in (("/depth/{run}", "DepthRun"), ("/saes/{sae_id}/features/{index}", "Feature")):
        schema = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}
    assert paths["/depth"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/DepthRunRow"}


def _open(page: Any, url: str, hash_: str, ready: str) -> None:
    page.goto(url + "/" + hash_)
    page.wait_for_selector(ready)
    page.wait_for_function("document.getElementById('status').textContent === ''")


def test_depth_page_in_chromium(browser: Any, depth_atlas: dict[str, Any], client: Any) -> None:  # noqa: F811
    sae_id = depth_atlas["sae_id"]
    sent = client.get("/depth/depth").json()
    with LiveServer(depth_atlas["root"]) as live:
        page = _page(browser, live.url)
        _open(page, live.url, "#/depth", "a.depth-run")
        assert page.locator("a.depth-run").all_inner_texts() == ["depth", "depth-families", "depth-pair", "planted"]
        assert page.get_attribute("#nav-depth", "class") == "active"
        page.click("a.depth-run:text-is('depth')")
        page.wait_for_selector("#depth-cka")
        page.wait_for_function("document.getElementById('status').textContent === ''")

        # ID and local ID against depth, with their intervals; the lenses; CKA; trajectories
        assert page.get_attribute("#depth-id .series-twonn", "data-points") == "4"
        assert page.locator("#depth-id path.band").count() == 3  # the TwoNN and MLE intervals and the local ID band
        for plot in ("#depth-lens-top1", "#depth-lens-kl"):
            assert [page.get_attribute(f"{plot} .series-{k}", "data-points") for k in ("logit", "tuned")] == ["4", "4"]
        assert page.get_attribute("#depth-cka", "data-cells") == "16" and page.locator(".cka-cell").count() == 16
        assert page.locator(".cka-cell title").first.inner_html() == "layer 0, layer 0: CKA 1"
        assert page.get_attribute("#depth-steps .series-curvature", "data-points") == "2"  # a turn needs two steps
        assert page.get_attribute("#dist-path_length", "data-count") == "150"
        headline = page.inner_text("#depth-headline")
        assert f"ID peaks at layer {sent['summary']['id_peak_layer']}" in headline
        assert page.locator("#depth-extremes li").count() == len(sent["extreme_tokens"]) == 10
        shown = [f for f in sent["features"] if f["shape"] != "typical"]
        assert page.locator("#depth-joined a.feat").count() == len(shown)
        assert page.locator("#depth-figures img").count() == 3

        # a families run: one line per family, every test
        page.select_option("#depth-pick", "depth-families")
        page.wait_for_selector("#family-lid")
        assert page.locator("#family-lid path.line").count() == 2
        assert page.locator("#family-tests tr").count() == 1 + len(client.get("/depth/depth-families").json()["family_tests"])

        # a pair run: A's layers against B's, and the shift from A to B with its interval
        page.select_option("#depth-pick", "depth-pair")
        page.wait_for_selector("#depth-shift")
        assert page.get_attribute("#depth-cka", "data-cells") == "16"
        assert page.locator(".cka-cell title").first.inner_html().startswith("layer of A 0, layer of B 0: CKA ")
        for name in ("mle", "lid"):
            assert page.get_attribute(f"#depth-shift-{name} .series-b", "data-points") == "4"
            assert page.locator(f"#depth-shift-{name}-delta path.band").count() == 1

        # the planted run: its extreme token opens the Text page on its context
        _open(page, live.url, "#/depth/planted", "#depth-extremes")
        page.click("#depth-extremes a.feat")
        page.wait_for_selector("#text-input")
        assert page.input_value("#text-input") == "the cat"

        # the feature page's depth card: what the planted join says, linked to its run
        _open(page, live.url, f"#/saes/{sae_id}/features/1", "#feature-depth")
        card = page.inner_text("#feature-depth")
        assert "planted: fires where the representation is compressing: at layer 2 its 12 tokens" in card
        assert page.locator("#feature-depth .feature-depth.compressing a[href='#/depth/planted']").count() == 1
        ARTIFACTS.mkdir(exist_ok=True)
        _open(page, live.url, "#/depth/depth", "#depth-cka")
        page.screenshot(path=str(ARTIFACTS / "depth.png"), full_page=True)

        # a damaged run is listed without a link, naming the file
        table = depth_atlas["root"] / "analyses" / "depth" / "planted.features.parquet"
        saved = table.read_bytes()
        try:
            table.write_bytes(b"broken")
            _open(page, live.url, "#/depth", ".depth-problem.damaged")
            assert page.locator("a.depth-run").all_inner_texts() == ["depth", "depth-families", "depth-pair"]
            assert "planted.features.parquet" in page.inner_text(".depth-problem.damaged[data-run='planted']")
        finally:
            table.write_bytes(saved)
        assert "\ufffd" not in page.inner_text("body") and "[object " not in page.inner_text("#view")
        assert not page.errors, page.errors
        assert not page.blocked, page.blocked
