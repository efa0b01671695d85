"""Labels appear wherever feature numbers do: a feature page's similar and cross-layer
features (Python, HTTP, the explorer read these), the CLI's `feature` card, and a
comparison's matched pairs (each side's label from its own atlas; Python, HTTP, CLI, the
Compare page), token search, the CLI contrast table, a spliced run's features, the SAE
page's per-latent table (HTTP, explorer) and the feature map (Python, HTTP, the Map page's
hover text), and the stored geometry runs whose rows name latents (Python, HTTP). The Steer
page's chosen feature is checked in test_browser_steering."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.api.sae_view import open_sae
from sae_atlas.store.analysis_runs import write_analysis
from tests.api.conftest import LiveServer
from tests.api.test_browser import _page, browser  # noqa: F401 (the browser fixture)
from tests.saes.compare_fixtures import one_thread  # noqa: F401


def test_feature_neighbours_carry_their_labels(small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    sae, other = small_atlas["sae_ids"]
    feature = atlas.feature(sae, 3, neighbours=4)
    assert feature.neighbours and feature.cross_layer
    for rows, frame in ((feature.neighbours, atlas.similar(sae, 3, k=4)), (feature.cross_layer, None)):
        assert all(isinstance(r["label"], str) and r["label"] for r in rows)
        if frame is not None:  # the same latents, in the same order, as the similar search
            assert [(r["latent"], r["label"]) for r in rows] == list(zip(frame["latent"], frame["label"], strict=True))
    assert {r["sae_id"] for r in feature.cross_layer} == {other}


def test_cli_feature_prints_the_label(small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][0]
    label = Atlas(small_atlas["root"]).feature(sae, 3).label
    out = CliRunner().invoke(app, ["feature", str(small_atlas["root"]), sae, "3"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert label and f"label: {label}" in out.output


def test_cli_text_search_prints_labels_and_leaves_bos_out(small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    found = Atlas(small_atlas["root"]).search_text("the cat sat", saes=[sae], k=2)
    out = CliRunner().invoke(app, ["search", "text", str(small_atlas["root"]), "the cat sat", "--sae-id", sae, "-k", "2"],
                             env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "<s>" not in out.output and found.features[sae][0][0]["label"] in out.output
    shown = CliRunner().invoke(app, ["search", "text", str(small_atlas["root"]), "the cat sat", "--sae-id", sae,
                                     "--include-special", "--json"])
    assert shown.exit_code == 0 and '"<s>"' in shown.output


@pytest.fixture(scope="module")
def compared(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Copies A and B of the small atlas and, stored in A by the CLI, a comparison of A's
    first SAE with B's second (its table printed at 200 columns)."""
    base = tmp_path_factory.mktemp("labels-compare")
    root, other = (Path(shutil.copytree(small_atlas["root"], base / name)) for name in ("a", "b"))
    a, b = small_atlas["sae_ids"]
    out = CliRunner().invoke(app, ["compare", f"{root}:{a}", f"{other}:{b}", "--tokens", "1024", "--context", "32",
                                   "--n-perm", "5", "--sample-tokens", "128", "--min-fires", "0", "--top", "3",
                                   "--run", "ab"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    return {"root": root, "other": other, "sae_ids": (a, b), "output": out.output}


def _labels(root: Path, sae_id: str) -> dict[int, str | None]:
    return dict(open_sae(Atlas(root).ctx, sae_id).labels_by_latent().select("latent", "label").iter_rows())


def test_compare_pairs_carry_each_sides_label(compared: dict[str, Any], tmp_path: Path) -> None:
    root, other = compared["root"], compared["other"]
    a, b = compared["sae_ids"]
    labels_a, labels_b = _labels(root, a), _labels(other, b)
    assert "a_label" in compared["output"] and "b_label" in compared["output"]  # the CLI's pairs table
    pairs = Atlas(root).comparison("ab").pairs
    assert len(pairs) == 64 and pairs["a_label"].null_count() < 64
    for row in pairs:
        assert row["a_label"] == labels_a.get(row["a_latent"]) and row["b_label"] == labels_b.get(row["b_latent"])
    # B's labels are B's latents' own, not A's labels of the same numbers
    assert any(labels_a.get(r["b_latent"]) != r["b_label"] for r in pairs)
    with TestClient(create_app(ServerSettings(root=root))) as http:
        sent = http.get("/compare/ab", params={"pairs": 5}).json()["pairs"]
    assert [(p["a_label"], p["b_label"]) for p in sent] == list(pairs.frame.head(5).select("a_label", "b_label").iter_rows())
    other.rename(tmp_path / "moved")  # B's atlas gone: the pairs still read, B's labels empty
    try:
        gone = Atlas(root).comparison("ab").pairs
        assert gone["b_label"].null_count() == 64 and gone["a_label"].to_list() == pairs["a_label"].to_list()
    finally:
        (tmp_path / "moved").rename(other)


def test_token_search_rows_carry_their_labels(small_atlas: dict[str, Any]) -> None:
    atlas, sae = Atlas(small_atlas["root"]), small_atlas["sae_ids"][0]
    labels = _labels(small_atlas["root"], sae)
    examples = open_sae(atlas.ctx, sae).tables().examples
    centre = examples.filter((pl.col("latent") == 3) & (pl.col("kind") == "top")).sort("act")["token_id"][-1]
    for token_id, frame in ((centre, "centred"), (atlas.feature(sae, 3).top_logits[0]["token_id"], "promoting")):
        rows = getattr(atlas.search_token(int(token_id), sae_id=sae, k=100), frame)
        assert len(rows) and 3 in rows["latent"].to_list()
        assert rows["label"].to_list() == [labels.get(latent) for latent in rows["latent"]]


def test_cli_contrast_table_has_the_label_column(small_atlas: dict[str, Any], tmp_path: Path) -> None:
    words = ["red", "blue", "green", "black"]
    (tmp_path / "a.txt").write_text("\n".join(f"the cat is {w}" for w in words))
    (tmp_path / "b.txt").write_text("\n".join(f"the chair is {w}" for w in words))
    args = ["search", "contrast", str(small_atlas["root"]), str(tmp_path / "a.txt"), str(tmp_path / "b.txt"),
            "-k", "3", "--permutations", "200"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    result = Atlas(small_atlas["root"]).contrast([f"the cat is {w}" for w in words],
                                                 [f"the chair is {w}" for w in words], k=3, n_permutations=200)
    header = next(line for line in out.output.splitlines() if "latent" in line and "auroc" in line)
    assert "label" in header and result.table["label"].null_count() < len(result.table)


def test_a_spliced_runs_features_carry_their_labels(small_atlas: dict[str, Any]) -> None:
    atlas, (a, b) = Atlas(small_atlas["root"]), small_atlas["sae_ids"]
    labels = {sid: _labels(small_atlas["root"], sid) for sid in (a, b)}
    out = atlas.run("the cat sat on the mat", [{"kind": "clamp", "sae": b, "feature": 3, "value": 2.0}], sae_ids=[a])
    assert set(out.features) == {a, b}  # the edited SAE is spliced too
    rows = [(sid, f) for sid, per_token in out.features.items() for feats in per_token for f in feats]
    assert rows and all(f["label"] == labels[sid].get(f["latent"]) for sid, f in rows)
    assert any(f["label"] for _, f in rows)
    sent = out.to_dict()["features"][a][1]
    assert [f["label"] for f in sent] == [f["label"] for f in out.features[a][1]]


def test_the_per_latent_table_page_carries_labels(small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    labels = _labels(small_atlas["root"], sae)
    with TestClient(create_app(ServerSettings(root=small_atlas["root"]))) as http:
        page = http.get(f"/saes/{sae}/features", params={"sort": "density", "offset": 3, "limit": 20}).json()
    assert len(page["rows"]) == 20 and any(r["label"] for r in page["rows"])
    assert all(r["label"] == labels.get(r["latent"]) for r in page["rows"])
    density = [r["density"] for r in page["rows"]]
    assert density == sorted(density, reverse=True)


def test_the_explorer_shows_labels_beside_pairs_and_latents(compared: dict[str, Any], browser: Any) -> None:  # noqa: F811
    root, (a, _) = compared["root"], compared["sae_ids"]
    pair = Atlas(root).comparison("ab").pairs[0]
    first = open_sae(Atlas(root).ctx, a).tables().features.sort("density", descending=True)["latent"][0]
    with LiveServer(root) as live:
        page = _page(browser, live.url)
        page.goto(live.url + "/#/compare/ab")
        page.wait_for_selector("#pair-table tr.pair-row")
        cells = page.locator("#pair-table tr.pair-row").first.locator("td").all_inner_texts()
        assert cells[:4] == [str(pair["a_latent"]), pair["a_label"] or "", str(pair["b_latent"]), pair["b_label"] or ""]
        page.goto(live.url + f"/#/saes/{a}")
        page.wait_for_selector("th:text-is('label')")
        label = _labels(root, a).get(first)
        row = page.locator("tr", has=page.locator(f"a:text-is('feature {first}')")).first.inner_text()
        assert label and label in row and not page.errors


def test_the_map_names_each_points_label(small_atlas: dict[str, Any], browser: Any) -> None:  # noqa: F811
    sae = small_atlas["sae_ids"][0]
    labels = _labels(small_atlas["root"], sae)
    frame = Atlas(small_atlas["root"]).map(sae)
    assert frame["label"].to_list() == [labels.get(latent) for latent in frame["latent"]]
    assert frame["label"].null_count() < len(frame)
    with LiveServer(small_atlas["root"]) as live:
        assert httpx.get(live.url + f"/saes/{sae}/map").json()["label"] == frame["label"].to_list()
        page = _page(browser, live.url)
        page.goto(live.url + f"/#/map/{sae}")
        canvas = page.wait_for_selector("#map-canvas[data-points]")
        choices = page.eval_on_selector_all("#map-colour option", "os => os.map((o) => o.value)")
        assert "in a circle" in choices and not {"label", "basis", "scores", "latent"} & set(choices)
        box = canvas.bounding_box()
        hit = page.evaluate("""() => {  // the first drawn pixel
            const c = document.getElementById('map-canvas'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let i = 3; i < d.length; i += 4) if (d[i] > 200) return [((i - 3) / 4) % c.width, Math.floor((i - 3) / 4 / c.width)];
            return null; }""")
        assert hit is not None, "no points drawn on the map"
        page.mouse.move(box["x"] + hit[0], box["y"] + hit[1])
        tip = page.text_content("#map-tip")
        latent = int(tip.split(" · ")[0].removeprefix("latent "))
        label = labels.get(latent)
        shown = f"latent {latent}" + (f" · {label}" if label else "")
        assert (tip == shown or tip.startswith(shown + " · ")) and not page.errors


def test_geometry_runs_naming_latents_carry_their_labels(small_atlas: dict[str, Any], tmp_path: Path) -> None:
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    a, b = small_atlas["sae_ids"]
    labels = {sid: _labels(root, sid) for sid in (a, b)}
    rows = pl.DataFrame({"sae_id": [b, a, "elsewhere", b], "latent": [3, 3, 3, 5], "score": [0.1, 0.2, 0.3, 0.4]},
                        schema_overrides={"latent": pl.Int32})
    write_analysis(root, "depth", "both", parameters={}, tables={"main": rows})
    write_analysis(root, "lobes", "one", parameters={"sae_id": a},
                   tables={"main": pl.DataFrame({"latent": [4, 2], "lobe": [0, 1]})})
    write_analysis(root, "lobes", "none", parameters={}, tables={"main": pl.DataFrame({"latent": [4], "lobe": [0]})})
    atlas = Atlas(root)
    both = atlas.analysis("depth", "both").table
    assert both.columns == ["sae_id", "latent", "label", "score"]  # beside the latent, each from its own SAE
    assert both["label"].to_list() == [labels[b][3], labels[a][3], None, labels[b][5]]
    assert labels[a][3] != labels[b][3] and both["label"].null_count() == 1
    assert atlas.analysis("lobes", "one").table["label"].to_list() == [labels[a][4], labels[a][2]]
    assert "label" not in atlas.analysis("lobes", "none").table.columns  # no SAE named: nothing to label
    with TestClient(create_app(ServerSettings(root=root))) as http:
        sent = http.get("/analyses/depth/both").json()
    assert sent["columns"][2] == "label" and [r["label"] for r in sent["rows"]] == both["label"].to_list()
