"""The HTTP contract, checked on the live service from its own `/openapi.json`.

`test_schemathesis_all_checks` runs schemathesis's engine as `schemathesis run --checks all
--mode all` does (every check, positive and negative data, the examples, coverage, fuzzing
and stateful phases): no 5xx, every status documented, every body of the documented shape,
schema-valid requests accepted and invalid ones rejected, 405 with `Allow` for undeclared
methods, and (on the token server) no data without the token. The document carries examples
from the served atlas (`api.http.examples`), so every operation is also called with data
that reaches a real SAE, feature, token and analysis: each must answer 2xx at least once
(the gated ones, 403 on the read-only server). The open server runs analyses and
interventions (on a copy of the atlas, as they write), so those routes are fuzzed too.
`test_live_answers_match_the_schema` validates one answer of every operation to a request
that reaches real data. The contract's settings are the repository's `schemathesis.toml` (the
operations whose schema-valid input only the model can refuse, with a declared 400), so the
CLI run it documents checks the same; this test adds only bounds on the examples per operation.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.graphs import store_graph
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.eval.mdl import MdlConfig
from sae_atlas.saes.eval.meta import MetaConfig
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.models import load_model
from sae_atlas.saes.transcoders.clt_store import clt_record, register_clt, save_clt
from sae_atlas.store.layout import AtlasLayout
from tests.api.conftest import TOKEN, LiveServer
from tests.api.test_compare_pages import CC, planted_crosscoder
from tests.api.test_depth_page import planted_run
from tests.api.test_steering_http import add_steering_tables
from tests.saes.graph_fixtures import random_clt

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install schemathesis)")
import tomllib  # noqa: E402 (Python 3.11+, as schemathesis itself)
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import events, from_schema  # noqa: E402

EXAMPLES_PER_OPERATION = 15
CONTRACT = Path(__file__).resolve().parents[2] / "schemathesis.toml"
CLT = "clt-fuzz"
GRAPH = "cat-graph"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Operation = tuple[str, str]
MODEL_BOUND = {("POST", "/run"), ("POST", "/steer"), ("POST", "/steer/stream"), ("POST", "/attribute"), ("POST", "/graph"),
               ("GET", "/steering/search"), ("POST", "/steering/search")}
"""Operations whose input only the model, the graph or the steering tables can judge: a prompt
of too many tokens, a position or token match outside it, a target that is not one token, a
node or a supernode's dictionary the graph lacks, a prompt set that leaves too few confirmation prompts for the target.
Their documented 400 answers to such schema-valid requests are accepted (`schemathesis.toml`),
and must say which of these it was."""
MODEL_BOUND_400 = re.compile(r"the prompt is \d+ tokens|outside the prompt|no prompt token matches|"
                             r"target .* tokens|outside the vocabulary|outside the \d+ tokens|"
                             r"needs at least two tokens|not in the model's vocabulary|a graph takes at most|"
                             r"not a feature node or supernode|features are active on this prompt|the same token twice|"
                             r"not a token of the model's vocabulary|drew the steering table's prompts|"
                             r"no token occurs at least twice|the confirmation set|user prompt\(s\): half rank|"
                             r"no ranking prompts for styles|names .*, which is not in the graph")
GATED = {("POST", "/analyses/circular"), *MODEL_BOUND}
"""Off on a read-only server: the documented 403."""


@pytest.fixture(scope="module")
def fuzz_atlas(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the small atlas with every kind of result the routes read: steering tables,
    the first SAE's core, MDL and meta-SAE evals, a stored comparison of the two SAEs, a
    planted crosscoder, a cross-layer transcoder of the model and a graph over it, stored, and a
    planted depth run joining the first SAE."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path_factory.mktemp("fuzz") / "atlas"))
    a, b = small_atlas["sae_ids"]
    add_steering_tables(root, [a, b])
    model = functools.cache(lambda: load_model(AtlasLayout(root).read_meta()["model"]))
    done = run_suite(root, [a], ["core", "mdl", "meta"], {"mdl": MdlConfig(n_tokens=2048),
                                                          "meta": MetaConfig(train_steps=100)},
                     device="cpu", model=model, progress=False)
    assert not done.failures, done.failures
    clt = random_clt(model())
    save_clt(clt.float(), AtlasLayout(root).clt_dir(CLT))
    register_clt(root, clt_record(CLT, clt.cfg, {}))
    store_graph(root, GRAPH, Atlas(root).graph("the cat sat", max_logits=2))
    Atlas(root).compare(root, sae=a, other_sae=b, run="layers", n_tokens=1024, sample_tokens=256, n_perm=10,
                        corpus=CorpusSpec(context_size=32))
    planted_crosscoder(root, small_atlas["sae_ids"], small_atlas["hooks"])
    planted_run(root, a)
    return root


@pytest.fixture(scope="module")
def read_only_token_server(fuzz_atlas: Path) -> Iterator[LiveServer]:
    """A server that requires the token but runs no analyses or interventions."""
    with LiveServer(fuzz_atlas, token=TOKEN) as live:
        yield live


@pytest.fixture(scope="module")
def read_only_server(fuzz_atlas: Path) -> Iterator[LiveServer]:
    """An open server that runs no analyses or interventions."""
    with LiveServer(fuzz_atlas) as live:
        yield live


@pytest.fixture(scope="module")
def open_server(fuzz_atlas: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """An open server that runs analyses and interventions, over its own copy of the fuzz
    atlas (fuzzing writes circular runs into it)."""
    root = Path(shutil.copytree(fuzz_atlas, tmp_path_factory.mktemp("fuzz-open") / "atlas"))
    with LiveServer(root, allow_analyses=True, allow_interventions=True) as live:
        yield live


def _all_checks_schema(url: str, headers: dict[str, str] | None) -> Any:
    """The repository's contract (`schemathesis.toml`) with every check, fewer examples of the
    slowest operations and no coverage phase for the two slowest (their 405s are checked by
    `test_a_path_answers_undeclared_methods_with_all_its_methods`)."""
    contract = tomllib.loads(CONTRACT.read_text())
    config = SchemathesisConfig.from_dict(contract | {"operations": [*contract["operations"],
        {"include-path-regex": "^/(steer|steer/stream|attribute|graph|analyses/circular|steering/search)$",
         "generation": {"max-examples": 5}},  # the slowest: model runs, discovery, steering searches
        {"include-path-regex": "^/(analyses/circular|steering/search)$",
         "phases": {"coverage": {"enabled": False}}},  # 1.5 to 2 s a run
    ]})
    config.update(seed=1, max_failures=None)
    project = config.projects.override
    project.checks.update(included_check_names=["all"])
    project.generation.update(modes=list(schemathesis.GenerationMode), max_examples=EXAMPLES_PER_OPERATION,
                              no_shrink=True, database="none")
    if headers:
        project.update(headers=headers)
    return schemathesis.openapi.from_url(url + "/openapi.json", config=config, headers=headers or {})


def _detail(status: int, content: bytes) -> str:
    """An error answer's `detail` (empty for a success)."""
    if status < 400:
        return ""
    try:
        return str(json.loads(content)["detail"])
    except (ValueError, KeyError, TypeError):
        return content[:200].decode(errors="replace")


Answer = tuple[int, str, bool]
"""An answer's status, its error detail, and whether the request was schema-valid."""


def _run(schema: Any) -> tuple[list[str], dict[Operation, list[Answer]]]:
    """(one line per failed check or engine error, every answer per operation)."""
    problems: list[str] = []
    answers: dict[Operation, list[Answer]] = defaultdict(list)
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for case_id, interaction in recorder.interactions.items():
                case = recorder.cases[case_id].value
                answer = interaction.response
                if answer is not None:
                    valid = case.meta is not None and case.meta.generation.mode.is_positive
                    answers[(case.method.upper(), case.operation.path)].append(
                        (answer.status_code, _detail(answer.status_code, answer.content), valid))
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        case = recorder.cases[case_id].value
                        answer = recorder.find_response(case_id=case_id)
                        status = answer.status_code if answer is not None else "no answer"
                        problems.append(f"{check.name}: {status} to {case.method} {case.formatted_path} {case.query} "
                                        f"{case.body if case.body is not None else ''}: "
                                        f"{check.failure_info.failure.title}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            problems.append(f"engine error: {getattr(event, 'value', getattr(event, 'exception', event))!r}")
    return sorted(set(problems)), answers


@pytest.mark.parametrize("which", ["open", "token"])
def test_schemathesis_all_checks(which: str, open_server: LiveServer, read_only_token_server: LiveServer) -> None:
    live, headers = (open_server, None) if which == "open" else (read_only_token_server, AUTH)
    schema = _all_checks_schema(live.url, headers)
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert len(operations) >= 20
    problems, answers = _run(schema)
    assert not problems, "\n".join(problems[:40])
    for operation in sorted(operations):
        statuses = sorted({status for status, _, _ in answers[operation]})
        if which == "token" and operation in GATED:
            assert 403 in statuses and not any(200 <= s < 300 for s in statuses), (operation, statuses)
        else:
            assert any(200 <= s < 300 for s in statuses), f"{operation} was never answered 2xx: {statuses}"
    for operation in MODEL_BOUND:  # a schema-valid request refused: only for what the model judges
        refused = [detail for status, detail, valid in answers[operation] if status == 400 and valid]
        unexplained = [detail for detail in refused if not MODEL_BOUND_400.search(detail)]
        assert not unexplained, (operation, unexplained)


def _live_requests(a: str, b: str) -> list[tuple[str, str, dict[str, Any]]]:
    """One request per operation that reaches a real SAE, feature, token or analysis."""
    steer = {"kind": "steer", "sae": a, "feature": 3, "alpha": 2.0}
    return [
        ("GET", "/saes", {}),
        ("GET", "/saes/{sae_id}", {"path_parameters": {"sae_id": a}}),
        ("GET", "/saes/{sae_id}/map", {"path_parameters": {"sae_id": b}}),
        ("GET", "/saes/{sae_id}/features", {"path_parameters": {"sae_id": a}, "query": {"sort": "density"}}),
        ("GET", "/saes/{sae_id}/features/{index}", {"path_parameters": {"sae_id": a, "index": 3}}),
        ("GET", "/saes/{sae_id}/features/{index}/examples", {"path_parameters": {"sae_id": a, "index": 3}}),
        ("GET", "/saes/{sae_id}/features/{index}/similar", {"path_parameters": {"sae_id": a, "index": 3}}),
        ("GET", "/saes/{sae_id}/features/{index}/flow", {"path_parameters": {"sae_id": a, "index": 3}}),
        ("GET", "/search/token", {"query": {"token": "cat"}}),
        ("GET", "/search/token/{token_id}", {"path_parameters": {"token_id": 26}}),
        ("POST", "/search/vector", {"body": {"vector": [0.5] * 32, "k": 3}}),
        ("POST", "/search/text", {"body": {"text": "the cat sat", "k": 2}}),
        ("POST", "/search/contrast", {"body": {"texts_a": ["the cat sat", "a cat ran"], "n_permutations": 100,
                                               "texts_b": ["the dog sat", "a dog ran"], "k": 3}}),
        ("POST", "/search/concept", {"body": {"concept": "weekdays", "saes": [a]}}),
        ("GET", "/search/geometry", {"query": {"saes": [a]}}),
        ("GET", "/search/labels", {"query": {"query": "cat"}}),
        ("GET", "/analyses", {}),
        ("GET", "/analyses/{kind}/{run}", {"path_parameters": {"kind": "planted", "run": "demo-run"}}),
        ("GET", "/analyses/{kind}/figures/{name}", {"path_parameters": {"kind": "planted", "name": "demo-run.png"}}),
        ("GET", "/health", {}),
        ("GET", "/board", {}),
        ("GET", "/saes/{sae_id}/evals/{eval_name}", {"path_parameters": {"sae_id": a, "eval_name": "core"}}),
        ("GET", "/compare", {}),
        ("GET", "/compare/{comparison}", {"path_parameters": {"comparison": "layers"}, "query": {"pairs": 3}}),
        ("GET", "/compare/{comparison}/{side}/features/{index}",
         {"path_parameters": {"comparison": "layers", "side": "b", "index": 3}}),
        ("GET", "/crosscoders", {}),
        ("GET", "/crosscoders/{crosscoder}/latents", {"path_parameters": {"crosscoder": CC},
                                                      "query": {"latent_class": "b_only", "sort": "nu_error"}}),
        ("GET", "/crosscoders/{crosscoder}/latents/{index}", {"path_parameters": {"crosscoder": CC, "index": 5}}),
        ("POST", "/analyses/circular", {"body": {"sae_id": a, "max_tokens": 256}}),
        ("POST", "/run", {"body": {"text": "the cat sat", "edits": [steer], "k": 3}}),
        ("POST", "/steer", {"body": {"text": "the cat sat", "edits": [steer], "max_new_tokens": 3}}),
        ("POST", "/steer/stream", {"body": {"text": "the cat sat", "edits": [steer], "max_new_tokens": 3}}),
        ("GET", "/steering/search", {"query": {"token": "cat", "sae_id": b, "k": 2}}),
        ("POST", "/steering/search", {"body": {"target": {"kind": "tokens", "tokens": ["cat", "dog"]}, "sae_ids": [a],
                                               "k": 2, "n_prompts": 4, "candidates": 4}}),
        ("POST", "/attribute", {"body": {"text": "the cat sat", "target": "sat", "top": 5, "verify": 1}}),
        ("POST", "/graph", {"body": {"text": "the cat sat", "max_logits": 2, "clt": CLT}}),
        ("GET", "/graphs", {}),
        ("GET", "/graphs/{run}", {"path_parameters": {"run": GRAPH}}),
        ("GET", "/depth", {}),
        ("GET", "/depth/{run}", {"path_parameters": {"run": "planted"}}),
    ]


@pytest.mark.parametrize("which", ["open", "read-only"])
def test_live_answers_match_the_schema(which: str, open_server: LiveServer, read_only_server: LiveServer,
                                       small_atlas: dict[str, Any]) -> None:
    """Real ids: every documented operation's answer validates against its response schema
    (and passes every other response check); a read-only server answers the gated ones 403."""
    live = open_server if which == "open" else read_only_server
    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    checked = set()
    for method, path, parts in _live_requests(*small_atlas["sae_ids"]):
        operation = schema[path][method]
        case = operation.Case(**parts)
        response = case.call(base_url=live.url, timeout=120)
        expected = 403 if which == "read-only" and (method, path) in GATED else 200
        assert response.status_code == expected, (method, path, response.text[:300])
        case.validate_response(response)
        checked.add((method, path))
    documented = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert not documented - checked, f"operations without a live check: {sorted(documented - checked)}"


def test_sae_ids_in_request_bodies_are_patterned(open_server: LiveServer, small_atlas: dict[str, Any]) -> None:
    """Wherever a request body names an SAE (or a stored run), the schema states the id
    pattern the server enforces: an unsafe id is a 422 naming the field, a safe unknown one
    a 404, never a 400 'invalid SAE id'."""
    spec = httpx.get(open_server.url + "/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for name in ("SteerEdit", "ClampEdit", "ScaleEdit", "AblateEdit", "ProjectOutEdit"):
        sae = schemas[name]["properties"]["sae"]
        assert sae["pattern"] == r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$" and sae["maxLength"] == 128, name
    assert schemas["RotateEdit"]["properties"]["circle"]["maxLength"] == 128
    a = small_atlas["sae_ids"][0]
    for sae, status in (("../x", 422), ("a..b", 422), ("x" * 129, 422), ("no-such-sae", 404)):
        edits = [{"kind": "steer", "sae": sae, "feature": 0, "alpha": 1.0}]
        for path, body in (("/run", {"text": "the cat", "edits": edits}),
                           ("/steer", {"text": "the cat", "edits": edits}),
                           ("/attribute", {"text": "the cat", "target": "cat", "sae_ids": [sae]})):
            answer = httpx.post(open_server.url + path, json=body, timeout=60)
            assert answer.status_code == status, (path, sae, answer.text)
    answer = httpx.post(open_server.url + "/run", timeout=60, json={
        "text": "the cat", "edits": [{"kind": "rotate", "circle": "../x"}]})
    assert answer.status_code == 422 and "circle" in answer.json()["detail"], answer.text
    assert httpx.post(open_server.url + "/run", json={"text": "   ", "sae_ids": [a]}).status_code == 422


def test_a_path_answers_undeclared_methods_with_all_its_methods(server: LiveServer) -> None:
    """OPTIONS and an undeclared method on every documented path are a 405 whose `Allow`
    names exactly the methods the document declares there: both where a GET and a POST route
    serve one path (`/steering/search`), which Starlette alone reports as the first route's."""
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"get", "post"} <= set(spec["paths"]["/steering/search"])
    for template, operations in spec["paths"].items():
        path = re.sub(r"\{[^}]+\}", "0", template)
        declared = {method.upper() for method in operations}
        for method in ("OPTIONS", "DELETE", "PATCH"):
            answer = httpx.request(method, server.url + path, timeout=30)
            assert answer.status_code == 405, (method, path, answer.text)
            assert set(answer.headers["allow"].split(", ")) == declared, (method, path, answer.headers["allow"])


def test_targets_the_schema_can_judge_are_422(open_server: LiveServer) -> None:
    """An empty target, a logit target without its token and a logit difference without the
    token it subtracts break the documented schema, and are refused as such (422 naming the
    target), not as a model-bound 400."""
    spec = httpx.get(open_server.url + "/openapi.json").json()
    target = spec["components"]["schemas"]["AttributionTarget"]
    assert target["properties"]["token"]["anyOf"][0]["minLength"] == 1 and len(target["anyOf"]) == 3
    for bad in ("", {"kind": "logit"}, {"kind": "logit_diff", "token": "cat"}, {"kind": "logit", "token": ""}):
        answer = httpx.post(open_server.url + "/attribute", json={"text": "the cat sat", "target": bad}, timeout=60)
        assert answer.status_code == 422 and "target" in answer.json()["detail"], (bad, answer.text)


def test_cross_field_rules_are_in_the_schema(open_server: LiveServer, small_atlas: dict[str, Any]) -> None:
    """Rules between fields that the service enforces are stated in the schema, so that a
    schema-valid request never breaks them: a graph over SAEs or a CLT, not both; a ranking
    confirmed on 0 or at least 2 prompts."""
    schemas = httpx.get(open_server.url + "/openapi.json").json()["components"]["schemas"]
    assert schemas["GraphRequest"]["not"]["required"] == ["saes", "clt"]
    assert schemas["SteeringQuery"]["properties"]["confirm_prompts"]["not"] == {"const": 1}
    both = {"text": "the cat sat", "saes": small_atlas["sae_ids"][:1], "clt": CLT}
    answer = httpx.post(open_server.url + "/graph", json=both, timeout=60)
    assert answer.status_code == 400 and "not both" in answer.json()["detail"], answer.text
