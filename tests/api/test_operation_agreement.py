"""Each operation is defined once (`api.operations`): its `Atlas` method, its CLI verb and
its HTTP body (or a GET route's query parameters) take the same parameters, with the same names, defaults and bounds, and a
value out of bounds is refused by all three, by the one definition. Every `Atlas` method
that takes options is either such an operation or named in `NOT_CONVERTED` (the gap shows)."""

from __future__ import annotations

import inspect
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.main import get_command
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.api.operations.operation import Operation
from sae_atlas.api.operations.registry import NOT_CONVERTED, OPERATIONS, Surfaces
from sae_atlas.errors import InvalidInputError

IDS = [s.python for s in OPERATIONS]
BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
              "maxItems", "pattern", "default", "enum", "const")


def _empty(value: Any) -> Any:
    """None for the 'nothing given' spellings of a list parameter ([], (), None); a list as
    a tuple."""
    if value in ([], (), None):
        return None
    return tuple(value) if isinstance(value, list | tuple) else value


def _default(params: type[Operation], name: str) -> Any:
    field = params.model_fields[name]
    return None if field.is_required() else _empty(params.default(name))


def _numeric(prop: dict[str, Any]) -> dict[str, Any]:
    """A property's schema, or its number branch when it is a number or None."""
    branches = prop.get("anyOf", [])
    numbers = [p for p in branches if p.get("type") in ("integer", "number")]
    return numbers[0] if len(numbers) == 1 and len(branches) == 2 and {"type": "null"} in branches else prop


def _bounds(params: type[Operation]) -> dict[str, tuple[float | None, bool, float | None, bool]]:
    """Numeric parameters (optional ones too) -> (low, low exclusive, high, high exclusive), from the schema."""
    out = {}
    for name, whole in params.model_json_schema()["properties"].items():
        prop = _numeric(whole)
        lo, lo_x = (prop["exclusiveMinimum"], True) if "exclusiveMinimum" in prop else (prop.get("minimum"), False)
        hi, hi_x = (prop["exclusiveMaximum"], True) if "exclusiveMaximum" in prop else (prop.get("maximum"), False)
        if lo is not None or hi is not None:
            out[name] = (lo, lo_x, hi, hi_x)
    return out


def _choices(params: type[Operation]) -> list[str]:
    """Parameters with a fixed set of values (a `Literal`, maybe None)."""
    props = params.model_json_schema()["properties"].items()
    return [name for name, prop in props if "enum" in prop or any("enum" in p for p in prop.get("anyOf", []))]


def _outside(params: type[Operation], name: str) -> list[Any]:
    """Values just outside parameter `name`'s bounds (of its type), or not among its choices."""
    if name in _choices(params):
        return ["no-such-choice"]
    lo, lo_x, hi, hi_x = _bounds(params)[name]
    integer = _numeric(params.model_json_schema()["properties"][name]).get("type") == "integer"
    step = 1 if integer else 0.5
    values = []
    if lo is not None:
        values.append(lo if lo_x else lo - step)
    if hi is not None:
        values.append(hi if hi_x else hi + step)
    return [int(v) if integer else float(v) for v in values]


def _command(verb: tuple[str, ...]) -> Any:
    command: Any = get_command(app)
    for word in verb:
        command = command.commands[word]
    return command


def test_every_atlas_method_with_options_is_an_operation_or_named_as_not_converted() -> None:
    converted = set(IDS)
    assert not converted & set(NOT_CONVERTED), "an operation is both converted and listed as not converted"
    for name, method in inspect.getmembers(Atlas, inspect.isfunction):
        if name.startswith("_"):
            continue
        options = [p for p in inspect.signature(method).parameters.values()
                   if p.kind is p.KEYWORD_ONLY or p.kind is p.VAR_KEYWORD or p.default is not p.empty]
        if options:
            assert name in converted or name in NOT_CONVERTED, (
                f"Atlas.{name} takes options but is neither in api.operations.registry.OPERATIONS nor NOT_CONVERTED")
    for name in NOT_CONVERTED:
        assert hasattr(Atlas, name), f"NOT_CONVERTED names {name!r}, which Atlas no longer has"


@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
def test_python_takes_the_parameters_with_their_defaults(op: Surfaces) -> None:
    signature = inspect.signature(getattr(Atlas, op.python)).parameters
    for name in op.params.model_fields:
        assert name in signature, f"Atlas.{op.python} lacks parameter {name!r}"
        given = signature[name].default
        assert _empty(None if given is inspect.Parameter.empty else given) == _default(op.params, name), (
            f"Atlas.{op.python}({name}=...) defaults to {given!r}, the operation to {_default(op.params, name)!r}")
    extra = set(signature) - {"self", *op.params.model_fields, *op.params.renamed, *op.python_only}
    assert not extra, f"Atlas.{op.python} takes {extra} that {op.params.__name__} does not define"
    assert not any(p.kind is p.VAR_KEYWORD for p in signature.values()), f"Atlas.{op.python} forwards **options"


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.cli], ids=[op.python for op in OPERATIONS if op.cli])
def test_the_cli_takes_the_parameters_with_their_defaults_and_no_bounds_of_its_own(op: Surfaces) -> None:
    assert op.cli is not None
    params = {p.name: p for p in _command(op.cli).params}
    for name in op.params.model_fields:
        assert name in params, f"`sae-atlas {' '.join(op.cli)}` lacks {name!r}"
        assert (params[name].param_type_name == "argument") == (name in op.cli_arguments), name
        if name not in op.cli_arguments:
            assert _empty(params[name].default) == _default(op.params, name), (
                f"--{name} defaults to {params[name].default!r}, the operation to {_default(op.params, name)!r}")
        assert params[name].min is None and params[name].max is None, (
            f"--{name} states bounds of its own; the operation's are checked when the verb calls Atlas")
    extra = set(params) - {"atlas", "old_atlas", *op.params.model_fields, *op.cli_only}
    assert not extra, f"`sae-atlas {' '.join(op.cli)}` takes {extra} that {op.params.__name__} does not define"


@pytest.fixture(scope="module")
def openapi(small_atlas: dict[str, Any]) -> dict[str, Any]:
    with TestClient(create_app(ServerSettings(root=small_atlas["root"]))) as http:
        return http.get("/openapi.json").json()


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _stated(prop: dict[str, Any]) -> dict[str, Any]:
    """What a property schema states of defaults and bounds (titles and texts aside; a null
    default is no default)."""
    return {k: v for k, v in prop.items() if k in BOUND_KEYS and not (k == "default" and v is None)}


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.http], ids=[op.python for op in OPERATIONS if op.http])
def test_http_states_the_parameters_with_their_defaults_and_bounds(op: Surfaces, openapi: dict[str, Any]) -> None:
    assert op.http is not None
    method, path = op.http
    route = openapi["paths"][path][method.lower()]
    if method == "GET":  # the query parameters are the operation's; what names the thing is in the path
        served = {p["name"]: p["schema"] for p in route["parameters"] if p["in"] == "query"}
    else:
        served = _resolve(route["requestBody"]["content"]["application/json"]["schema"], openapi)["properties"]
    own = {name: prop for name, prop in op.params.model_json_schema()["properties"].items()
           if name not in op.http_absent}
    assert set(served) == set(own), f"{method} {path} takes {set(served) ^ set(own)} beside {op.params.__name__}"
    for name, prop in own.items():
        if name not in op.http_narrowed:
            assert _stated(served[name]) == _stated(prop), f"{method} {path}: {name}"
            continue
        narrow, wide = _stated(served[name]), _stated(prop)  # HTTP may only take less
        assert narrow.get("default") == wide.get("default"), f"{method} {path}: {name}"
        for low in ("minimum", "minItems", "minLength"):
            assert narrow.get(low, -math.inf) >= wide.get(low, -math.inf), f"{method} {path}: {name} {low}"
        for high in ("maximum", "maxItems", "maxLength"):
            assert narrow.get(high, math.inf) <= wide.get(high, math.inf), f"{method} {path}: {name} {high}"


@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
def test_a_value_out_of_bounds_is_refused_by_python_the_cli_and_http(op: Surfaces, small_atlas: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    root = small_atlas["root"]
    names = {"{atlas}": str(root), "{sae}": small_atlas["sae_ids"][0]}
    example = {name: names.get(value, value) if isinstance(value, str) else value for name, value in op.example.items()}
    arguments = [names.get(value, value.replace("{atlas}", str(root))) for value in op.cli_example]
    for name in op.cli_arguments:  # a list argument is a file on the command line
        value = example[name]
        if isinstance(value, list):
            (tmp_path / f"{name}.json").write_text(json.dumps(value))
            value = tmp_path / f"{name}.json"
        arguments.append(str(value))
    atlas = Atlas(root)
    bounded = [*_bounds(op.params), *_choices(op.params)]
    if not bounded:  # only an operation without numbers or choices (ids, paths, flags) states none
        numbers = [name for name, prop in op.params.model_json_schema()["properties"].items()
                   if '"integer"' in json.dumps(prop) or '"number"' in json.dumps(prop)]
        assert not numbers, f"{op.params.__name__} states no bounds on {numbers}"
        pytest.skip(f"{op.params.__name__} has no numeric or fixed-choice parameters")
    with TestClient(create_app(ServerSettings(root=root, allow_interventions=True))) as http:
        for name in bounded:
            for bad in _outside(op.params, name):
                with pytest.raises(InvalidInputError, match=name):
                    getattr(atlas, op.python)(**example, **{name: bad})
                if op.cli:
                    flag = next(p for p in _command(op.cli).params if p.name == name).opts[0]
                    atlas_args = [op.cli_atlas, str(root)] if op.cli_atlas else [str(root)]
                    args = [*op.cli, *atlas_args, *arguments, flag, str(bad)]
                    out = CliRunner().invoke(app, args)
                    assert out.exit_code == 2 and name in out.output, (args, out.output)
                if op.http:
                    method, path = op.http
                    if method == "GET":
                        target = re.sub(r"\{(\w+)\}", lambda m: str(example.get(m[1], 0)), path)
                        query = {k: v for k, v in example.items() if k in op.params.model_fields}
                        answer = http.get(target, params={**query, name: bad})
                    else:
                        answer = http.request(method, path, json={**example, name: bad})
                    assert answer.status_code == 422 and name in answer.text, (name, bad, answer.text)


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.params.renamed],
                         ids=[op.python for op in OPERATIONS if op.params.renamed])
def test_old_parameter_names_are_still_taken_with_a_deprecation(op: Surfaces) -> None:
    for old, new in op.params.renamed.items():
        schema = json.dumps(op.params.model_json_schema()["properties"][new])
        given, other = (2, 3) if '"integer"' in schema and '"array"' not in schema else (["x"], ["y"])
        if '"array"' not in schema and '"string"' in schema:
            given, other = "x", "y"
        example = {name: value for name, value in op.example.items() if name != new}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = op.params.of(**example, **{old: given})
        assert getattr(value, new) == given and any(issubclass(w.category, DeprecationWarning) for w in caught)
        with pytest.raises(InvalidInputError, match=f"old name of '{new}'"):
            op.params.of(**example, **{old: given, new: other})
