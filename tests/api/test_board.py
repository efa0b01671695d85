"""The eval board: `Atlas.board()` over verified evals results, damaged rows, `GET /board`."""

import httpx
import polars as pl
import pytest
import torch
from safetensors.torch import save_file

from sae_atlas.api.atlas import Atlas
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.ground_truth import ground_truth_config
from sae_atlas.saes.eval.mdl import MdlConfig
from sae_atlas.saes.eval.results import result_paths
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from tests.api.conftest import LiveServer
from tests.saes.planted import planted_atoms, write_planted_atlas

HOOK = "blocks.0.hook_resid_post"


def no_model():
    raise InvalidInputError("no model here")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A planted atlas with three SAEs: two with ground_truth and mdl results, one with none."""
    root = tmp_path_factory.mktemp("board") / "atlas"
    write_planted_atlas(root, [HOOK], d_in=16, n_atoms=24, n_blocks=8, context=16)
    AtlasLayout(root).write_meta({"model": {"kind": "tiny"}, "hooks": [HOOK]})
    for seed, sae_id in enumerate(("a", "b", "unevaluated")):
        save_saelens(build_sae(SAEConfig("topk", d_in=16, d_sae=24, k=2, hook_name=HOOK, seed=seed)),
                     AtlasLayout(root).sae_dir(sae_id))
    AtlasLayout(root).update_meta(saes={s: {"sae_id": s, "hook": HOOK} for s in ("a", "b", "unevaluated")})
    truth = root.parent / "truth.safetensors"
    save_file({"W_dec": planted_atoms(16, 24).contiguous()}, str(truth))
    configs = {"ground_truth": ground_truth_config(truth), "mdl": MdlConfig(n_tokens=64)}
    done = run_suite(root, ["a", "b"], ["ground_truth", "mdl"], configs, device="cpu", model=no_model, progress=False)
    assert not done.failures, done.failures
    return root


def test_board_has_one_row_per_sae_and_one_column_per_metric(evaluated):
    frame = Atlas(evaluated).board().frame
    assert frame["sae_id"].to_list() == ["a", "b", "unevaluated"]
    assert frame.columns[:3] == ["sae_id", "status", "problem"]
    assert {"ground_truth/mcc", "ground_truth/frac_recovered", "mdl/description_length", "mdl/num_bins"} <= set(
        frame.columns)
    assert frame["status"].to_list() == ["ok"] * 3 and frame["problem"].null_count() == 3
    assert frame.schema["ground_truth/mcc"] == pl.Float64
    mcc = frame["ground_truth/mcc"].to_list()
    assert 0 < mcc[0] < 1 and 0 < mcc[1] < 1 and mcc[2] is None


def test_board_serves_over_http(evaluated):
    with LiveServer(evaluated) as live:
        body = httpx.get(live.url + "/board", timeout=30).json()
    assert "ground_truth/mcc" in body["columns"] and [row["sae_id"] for row in body["rows"]] == ["a", "b", "unevaluated"]
    assert set(body["rows"][0]["metrics"]) == set(body["columns"])
    assert body["rows"][2]["metrics"]["mdl/description_length"] is None
    assert body["rows"][0]["status"] == "ok"


def test_a_damaged_result_marks_its_row_and_names_the_file(evaluated, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(evaluated, root)
    path, _ = result_paths(root, "b", "mdl")
    path.write_text(path.read_text()[:-20])
    frame = Atlas(root).board().frame
    row = frame.row(1, named=True)
    assert row["status"] == "damaged" and "saes/b/evals/mdl.json" in row["problem"]
    assert "sae-atlas eval" in row["problem"] and row["mdl/description_length"] is None
    assert row["ground_truth/mcc"] is not None and frame.row(0, named=True)["status"] == "ok"
    assert torch.isfinite(torch.tensor(frame["ground_truth/mcc"][0]))


def test_openapi_publishes_the_board_type(evaluated):
    from pydantic import TypeAdapter

    from sae_atlas.api.http import ServerSettings, create_app
    from sae_atlas.api.results.board import Board

    spec = create_app(ServerSettings(root=evaluated)).openapi()
    schema = spec["paths"]["/board"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Board"}
    own = TypeAdapter(Board).json_schema(mode="serialization", ref_template="#/components/schemas/{model}")
    assert set(own["properties"]) == {"columns", "rows"} and "BoardRow" in spec["components"]["schemas"]


def test_an_unregistered_sae_is_marked_on_the_board(evaluated, tmp_path):
    import shutil

    root = tmp_path / "atlas"
    shutil.copytree(evaluated, root)
    layout = AtlasLayout(root)
    meta = layout.read_meta()
    del meta["saes"]["b"]
    layout.write_meta(meta)
    rows = {r["sae_id"]: r for r in Atlas(root).board().frame.to_dicts()}
    assert rows["a"]["status"] == "ok"
    assert rows["b"]["status"] == "unregistered" and "sae-atlas register" in rows["b"]["problem"]
    assert rows["b"]["ground_truth/mcc"] == rows["b"]["ground_truth/mcc"]  # its results are still shown


def test_a_result_without_its_sidecar_is_named_for_every_eval(evaluated, tmp_path):
    """A result whose sidecar is gone (deleted, or a kill between the two writes) is damaged
    on the board and refused by name by `eval_result` and over HTTP, never "not evaluated"."""
    import shutil

    from sae_atlas.errors import IntegrityError
    from sae_atlas.saes.eval.results import read_result
    from sae_atlas.saes.eval.spec import EVAL_NAMES

    root = tmp_path / "copy"
    shutil.copytree(evaluated, root)
    result, sidecar = result_paths(root, "a", "ground_truth")
    sidecar.unlink()  # a's ground_truth: the sidecar deleted
    for name in EVAL_NAMES:  # every eval kind: its result written, its sidecar never
        orphan, missing = result_paths(root, "unevaluated", name)
        orphan.parent.mkdir(exist_ok=True)
        shutil.copyfile(result, orphan)
        assert not missing.exists()
    atlas = Atlas(root)
    rows = {r["sae_id"]: r for r in atlas.board().frame.to_dicts()}
    assert rows["a"]["status"] == "damaged" and rows["a"]["ground_truth/mcc"] is None
    assert "saes/a/evals/ground_truth.json: has no sidecar ground_truth.sha256.json" in rows["a"]["problem"]
    assert rows["a"]["mdl/description_length"] is not None  # its verified result is still shown
    assert rows["b"]["status"] == "ok" and rows["unevaluated"]["status"] == "damaged"
    with LiveServer(root) as live:
        for name in EVAL_NAMES:
            assert f"saes/unevaluated/evals/{name}.json: has no sidecar {name}.sha256.json" in rows["unevaluated"][
                "problem"]
            with pytest.raises(IntegrityError, match=f"evals/{name}.json: has no sidecar") as refused:
                atlas.eval_result("unevaluated", name)
            assert f"sae-atlas eval {root} --sae unevaluated --suite {name}" in str(refused.value)
            with pytest.raises(IntegrityError, match="has no sidecar"):
                read_result(root, "unevaluated", name)
            answer = httpx.get(f"{live.url}/saes/unevaluated/evals/{name}", timeout=30)
            assert answer.status_code == 500, answer.text
            body = answer.json()
            assert body["error"] == "integrity" and body["path"] == f"saes/unevaluated/evals/{name}.json"
            assert f"has no sidecar {name}.sha256.json" in body["detail"]
    with pytest.raises(Exception, match="has no sidecar"):
        atlas.eval_result("a", "ground_truth")
