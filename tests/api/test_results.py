"""The result types are defined once (`api.results`): a real instance of each sends exactly
what its JSON schema describes, loses nothing on the way, and the service's OpenAPI
document publishes those same schemas; `import sae_atlas` loads no CLI (typer, rich)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from pydantic import TypeAdapter

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.api.http.json_body import dumps
from sae_atlas.api.results.analysis import AnalysisResult, AnalysisRunFiles
from sae_atlas.api.results.board import Board
from sae_atlas.api.results.compare import CompareResult, CompareRunRow
from sae_atlas.api.results.crosscoder import CrosscoderLatentCard, CrosscoderLatents, CrosscoderRow
from sae_atlas.api.results.feature import Feature, Match
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView
from sae_atlas.api.results.jsonable import to_jsonable
from sae_atlas.api.results.meaning import ConceptResult, ContrastResult
from sae_atlas.api.results.sae import SaeInfo, SaeStatus
from sae_atlas.api.results.search import TextSearch, TokenFeatures
from tests.api.test_compare_pages import CC, compared  # noqa: F401 (the compared fixture)

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (it comes with schemathesis)")
TEXT = "the cat sat on the mat"


def _fields(result: Any, *leave_out: str) -> dict[str, Any]:
    return {f.name: to_jsonable(getattr(result, f.name)) for f in dataclasses.fields(result) if f.name not in leave_out}


def _sent(result: Any) -> dict[str, Any]:
    """What the service would send before the types were written down: every field, frames
    as lists of rows (the reference `to_dict()` must still match)."""
    if isinstance(result, TokenFeatures):
        return {**_fields(result, "centred", "promoting"), "centred": result.centred.to_dicts(),
                "promoting": result.promoting.to_dicts()}
    if isinstance(result, AnalysisResult):
        table = result.table
        return {**_fields(result, "table", "figures"), "figures": [p.name for p in result.figures],
                "columns": table.columns if table is not None else None,
                "rows": table.head(1000).to_dicts() if table is not None else None,
                "n_rows": table.height if table is not None else 0}
    if isinstance(result, ContrastResult):
        return {**_fields(result, "table"), "features": result.table.to_dicts()}
    if isinstance(result, ConceptResult):
        return {**_fields(result, "features"), "features": result.features.to_dicts()}
    if isinstance(result, CompareResult):
        return {**_fields(result, "pairs"), "pairs": result.pairs[:500].to_dicts()}
    return _fields(result, "logits_TV", "codes")


@pytest.fixture(scope="module")
def results(small_atlas: dict[str, Any], compared: dict[str, Any]) -> dict[type, Any]:  # noqa: F811
    """One real instance of every result type, from the small atlas (comparisons and a
    crosscoder from a copy of it)."""
    a, b = small_atlas["sae_ids"]
    atlas = Atlas(small_atlas["root"])
    steering = Atlas(small_atlas["root"])  # its SAEs are not loaded under inference mode (search_text does that)
    ran = steering.run(TEXT, saes=[a])
    built = [
        atlas.feature(a, 3),
        atlas.search_text("the cat sat", k=2),
        atlas.search_token("cat", k=3),
        atlas.analysis("planted", "demo-run"),
        atlas.contrast(["the cat sat", "a cat ran"], ["the dog sat", "a dog ran"], k=3, n_permutations=100),
        atlas.concept_search("weekdays", saes=[b]),
        ran,
        steering.attribute(TEXT, "the", saes=[a], top=5, verify=2),
        steering.steer(TEXT, saes=[a], feature=int(ran.codes[a][-1].argmax()), alpha=4.0, max_new_tokens=3),
        compared["layers"],
        Atlas(compared["root"]).crosscoder_latents(CC, latent_class="b_only"),
        Atlas(compared["root"]).crosscoder_latent(CC, 5),
    ]
    return {type(result): result for result in built}


RESULT_TYPES = [Feature, TextSearch, TokenFeatures, AnalysisResult, ContrastResult, ConceptResult, RunView, SteerView,
                AttributionView, CompareResult, CrosscoderLatents, CrosscoderLatentCard]


@pytest.mark.filterwarnings("error")  # a value of a type other than the declared one warns while serializing
@pytest.mark.parametrize("result_type", RESULT_TYPES, ids=lambda t: t.__name__)
def test_payload_matches_the_one_definition(results: dict[type, Any], result_type: type) -> None:
    result = results[result_type]
    payload = result.to_dict()
    wire = json.loads(dumps(payload))  # as the service sends it: NaN as null
    jsonschema.validate(wire, TypeAdapter(result_type).json_schema(mode="serialization"))
    assert wire == json.loads(dumps(_sent(result)))  # typed rows drop no key
    assert json.loads(json.dumps(payload)) == payload  # JSON-ready as it is


def test_feature_and_text_search_send_their_fields_as_they_are(results: dict[type, Any]) -> None:
    """The service sends these two straight from the dataclass (orjson): the same payload."""
    for result_type in (Feature, TextSearch):
        assert json.loads(dumps(results[result_type])) == json.loads(dumps(results[result_type].to_dict()))


def test_python_side_keeps_frames_and_tensors(results: dict[type, Any]) -> None:
    contrast, run, analysis = results[ContrastResult], results[RunView], results[AnalysisResult]
    assert len(contrast.table) == len(contrast.to_dict()["features"]) and "table" not in contrast.to_dict()
    assert run.logits_TV is not None and run.codes and not {"logits_TV", "codes"} & set(run.to_dict())
    short = analysis.to_dict(max_rows=1)
    assert len(short["rows"]) == 1 and short["n_rows"] == analysis.table.height > 1


def test_sae_info_and_status_have_the_declared_keys(small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    sae_id = small_atlas["sae_ids"][0]
    assert list(atlas.sae_info(sae_id)) == list(SaeInfo.__annotations__)
    status = atlas.sae_status(sae_id)
    assert list(status) == list(SaeStatus.__annotations__)
    jsonschema.validate(json.loads(dumps(status)), TypeAdapter(SaeStatus).json_schema(mode="serialization"))


def test_openapi_publishes_the_result_types(small_atlas: dict[str, Any]) -> None:
    spec = create_app(ServerSettings(root=small_atlas["root"])).openapi()
    components = spec["components"]["schemas"]
    answers = {("get", "/saes/{sae_id}/features/{index}"): Feature, ("post", "/search/text"): TextSearch,
               ("get", "/search/token"): TokenFeatures, ("get", "/search/token/{token_id}"): TokenFeatures,
               ("get", "/analyses/{kind}/{run}"): AnalysisResult, ("post", "/analyses/circular"): AnalysisResult,
               ("post", "/search/contrast"): ContrastResult, ("post", "/search/concept"): ConceptResult,
               ("post", "/run"): RunView, ("post", "/steer"): SteerView, ("post", "/attribute"): AttributionView,
               ("get", "/saes/{sae_id}"): SaeInfo, ("get", "/saes"): list[SaeStatus],
               ("get", "/saes/{sae_id}/features/{index}/similar"): list[Match],
               ("get", "/analyses"): list[AnalysisRunFiles], ("get", "/board"): Board,
               ("get", "/compare"): list[CompareRunRow], ("get", "/compare/{comparison}"): CompareResult,
               ("get", "/compare/{comparison}/{side}/features/{index}"): Feature,
               ("get", "/crosscoders"): list[CrosscoderRow],
               ("get", "/crosscoders/{crosscoder}/latents"): CrosscoderLatents,
               ("get", "/crosscoders/{crosscoder}/latents/{index}"): CrosscoderLatentCard}
    for (method, path), answer in answers.items():
        schema = spec["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        listed = getattr(answer, "__origin__", None) is list
        result_type = answer.__args__[0] if listed else answer
        assert (schema["items"] if listed else schema) == {"$ref": f"#/components/schemas/{result_type.__name__}"}
        own = TypeAdapter(result_type).json_schema(mode="serialization", ref_template="#/components/schemas/{model}")
        for name, definition in {**own.pop("$defs", {}), result_type.__name__: own}.items():
            assert _without_defaults(components[name]) == _without_defaults(definition), name


def _without_defaults(schema: Any) -> Any:
    """A JSON schema without `default`s (FastAPI leaves them out of response schemas)."""
    if isinstance(schema, dict):
        return {k: _without_defaults(v) for k, v in schema.items() if k != "default"}
    return [_without_defaults(v) for v in schema] if isinstance(schema, list) else schema


def test_importing_the_facade_loads_no_cli() -> None:
    """`from sae_atlas import Atlas` loads neither typer nor rich; a failure names who imported them."""
    probe = """
import importlib.abc, json, sys, traceback
class Watch(importlib.abc.MetaPathFinder):
    who = {}
    def find_spec(self, name, path=None, target=None):
        if name in ("typer", "rich") and name not in self.who:
            self.who[name] = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                              if "importlib" not in f.filename and "<" not in f.filename]
        return None
sys.meta_path.insert(0, Watch())
import sae_atlas
from sae_atlas import Atlas
print(json.dumps({name: Watch.who.get(name) for name in ("typer", "rich") if name in sys.modules}))
"""
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[2], check=True)
    loaded = json.loads(answer.stdout.strip().splitlines()[-1])
    assert not loaded, json.dumps(loaded, indent=1)


def test_rows_are_typed_rows_and_a_frame() -> None:
    """`Rows[RowT]`: rows as dicts of the row type, columns as Series, `.frame` with the row
    type's dtypes; a column the type does not declare, or a required one missing, is refused."""
    from sae_atlas.api.results.feature import Match
    from sae_atlas.api.results.feature_map import MapPoint
    from sae_atlas.api.results.rows import Rows

    stored = pl.DataFrame({"sae_id": ["a", "b"], "latent": pl.Series([3, 4], dtype=pl.Int32), "cosine": [0.5, 0.25],
                           "rank": [0, 1], "layer": [1, 2]}).with_columns(pl.col("cosine").cast(pl.Float32))
    rows = Rows(Match, stored)
    assert rows.frame.schema["latent"] == pl.Int64 and rows.frame.schema["cosine"] == pl.Float64
    assert len(rows) == 2 and rows[0] == {"sae_id": "a", "latent": 3, "cosine": 0.5, "rank": 0, "layer": 1}
    assert [r["latent"] for r in rows] == [3, 4] and rows[-1]["sae_id"] == "b" and rows["latent"].to_list() == [3, 4]
    assert rows[1:].to_dicts() == [rows[1]] and rows.to_dicts() == stored.to_dicts()  # the wire keeps the values
    with pytest.raises(IndexError):
        rows[2]
    empty = Rows(Match, pl.DataFrame())
    assert len(empty) == 0 and empty.columns[:5] == ["sae_id", "latent", "cosine", "rank", "layer"]
    with pytest.raises(TypeError, match="no column \\['extra'\\]"):
        Rows(Match, stored.with_columns(pl.lit(1).alias("extra")))
    with pytest.raises(TypeError, match="need the columns \\['cosine'\\]"):
        Rows(Match, stored.drop("cosine"))
    points = Rows(MapPoint, pl.DataFrame({"latent": [0], "x": [0.0], "y": [1.0], "knn_overlap": [0.5], "label": [None],
                                          "cluster": [2]}))
    assert points[0]["cluster"] == 2  # a map's group columns are declared as allowed
    adapter = TypeAdapter(Rows[Match])
    assert adapter.dump_python(rows, mode="json") == rows.to_dicts()
    assert adapter.validate_python(rows.to_dicts()) == rows
    assert adapter.json_schema(mode="serialization")["type"] == "array"


@pytest.mark.parametrize("method", ["saes", "similar", "flow", "examples", "features", "search_vector", "search_labels",
                                    "geometry_features", "map", "analyses"])
def test_each_table_method_gives_rows_of_its_declared_type(small_atlas: dict[str, Any], server: Any,
                                                           method: str) -> None:
    """What each table method returns fits its row type, and HTTP sends exactly its rows."""
    import typing

    from sae_atlas.api.results.rows import Rows

    a, b = small_atlas["sae_ids"]
    atlas = Atlas(small_atlas["root"])
    calls = {"saes": (), "similar": (a, 3), "flow": (a, 3), "examples": (a, 3), "features": (a,),
             "search_vector": ([1.0] * 32,), "search_labels": ("the",), "geometry_features": (), "map": (b,),
             "analyses": ()}
    result = getattr(atlas, method)(*calls[method])
    declared = typing.get_type_hints(getattr(Atlas, method))["return"]
    assert isinstance(result, Rows) and result.row_type is typing.get_args(declared)[0]
    assert len(result) or method == "geometry_features"  # the small atlas stores no geometry records
    jsonschema.validate(json.loads(dumps(result.to_dicts())),
                        TypeAdapter(list[result.row_type]).json_schema(mode="serialization"))
    paths = {"saes": "/saes", "similar": f"/saes/{a}/features/3/similar", "flow": f"/saes/{a}/features/3/flow",
             "examples": f"/saes/{a}/features/3/examples", "analyses": "/analyses"}
    if method in paths:
        assert httpx.get(server.url + paths[method], timeout=30).json() == json.loads(dumps(result.to_dicts()))
