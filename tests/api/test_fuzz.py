"""The HTTP contract, checked on the live service from its own `/openapi.json`.

`test_schemathesis_all_checks` runs schemathesis's engine as `schemathesis run --checks all
--mode all` does (every check, positive and negative data, the examples, coverage, fuzzing
and stateful phases): no 5xx, every status documented, every body of the documented shape,
schema-valid requests accepted and invalid ones rejected, 405 with `Allow` for undeclared
methods, and (on the token server) no data without the token. `test_live_answers_match_the_schema`
validates the answers to requests that reach real SAEs, features and analyses, which random
ids rarely do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import TOKEN, LiveServer

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install schemathesis)")
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import events, from_schema  # noqa: E402

EXAMPLES_PER_OPERATION = 15
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def read_only_token_server(small_atlas: dict[str, Any]) -> Iterator[LiveServer]:
    """A server that requires the token but runs no analyses (fuzzing must not start them)."""
    with LiveServer(small_atlas["root"], token=TOKEN) as live:
        yield live


def _all_checks_schema(url: str, headers: dict[str, str] | None) -> Any:
    config = SchemathesisConfig()
    config.update(seed=1, max_failures=None)
    project = config.projects.override
    project.checks.update(included_check_names=["all"])
    project.generation.update(modes=list(schemathesis.GenerationMode), max_examples=EXAMPLES_PER_OPERATION,
                              no_shrink=True, database="none")
    if headers:
        project.update(headers=headers)
    return schemathesis.openapi.from_url(url + "/openapi.json", config=config, headers=headers or {})


def _run(schema: Any) -> tuple[int, list[str]]:
    """(number of scenarios, one line per failed check or engine error)."""
    problems: list[str] = []
    scenarios = 0
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        case = event.recorder.cases[case_id].value
                        answer = event.recorder.find_response(case_id=case_id)
                        status = answer.status_code if answer is not None else "no answer"
                        problems.append(f"{check.name}: {status} to {case.method} {case.formatted_path} {case.query} "
                                        f"{case.body if case.body is not None else ''}: "
                                        f"{check.failure_info.failure.title}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            problems.append(f"engine error: {getattr(event, 'value', getattr(event, 'exception', event))!r}")
    return scenarios, sorted(set(problems))


@pytest.mark.parametrize("which", ["open", "token"])
def test_schemathesis_all_checks(which: str, server: LiveServer, read_only_token_server: LiveServer) -> None:
    live, headers = (server, None) if which == "open" else (read_only_token_server, AUTH)
    schema = _all_checks_schema(live.url, headers)
    assert len(list(schema.get_all_operations())) >= 15
    scenarios, problems = _run(schema)
    assert scenarios >= 15
    assert not problems, "\n".join(problems[:40])


GATED = {("POST", "/analyses/circular"): {"sae_id": "x"},  # off on a read-only server: the documented 403
         ("POST", "/run"): {"text": "the cat", "edits": []},
         ("POST", "/steer"): {"text": "the cat", "edits": [{"kind": "steer", "sae": "x", "feature": 0, "alpha": 1.0}]},
         ("POST", "/attribute"): {"text": "the cat", "target": "sat"}}


def _live_requests(a: str, b: str) -> list[tuple[str, str, dict[str, Any]]]:
    """One request per operation that reaches a real SAE, feature, token or analysis."""
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
        ("POST", "/search/concept", {"body": {"concept": "weekdays", "sae_ids": [a]}}),
        ("GET", "/search/geometry", {"query": {"sae_id": a}}),
        ("GET", "/search/labels", {"query": {"q": "cat"}}),
        ("GET", "/analyses", {}),
        ("GET", "/analyses/{kind}/{run}", {"path_parameters": {"kind": "planted", "run": "demo-run"}}),
        ("GET", "/analyses/{kind}/figures/{name}", {"path_parameters": {"kind": "planted", "name": "demo-run.png"}}),
        ("GET", "/health", {}),
        *[(method, path, {"body": body}) for (method, path), body in GATED.items()],
    ]


def test_live_answers_match_the_schema(server: LiveServer, small_atlas: dict[str, Any]) -> None:
    """Real ids: every documented operation's answer validates against its response schema
    (and passes every other response check)."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    checked = set()
    for method, path, parts in _live_requests(*small_atlas["sae_ids"]):
        operation = schema[path][method]
        case = operation.Case(**parts)
        response = case.call(base_url=server.url, timeout=120)
        expected = 403 if (method, path) in GATED else 200
        assert response.status_code == expected, (method, path, response.text[:300])
        case.validate_response(response)
        checked.add((method, path))
    documented = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert not documented - checked, f"operations without a live check: {sorted(documented - checked)}"


def test_errors_have_the_documented_shape(server: LiveServer) -> None:
    """422 (validation), 404 (unknown route) and 400 answers are all `ErrorBody`."""
    spec = httpx.get(server.url + "/openapi.json").json()
    error_schema = spec["components"]["schemas"]["ErrorBody"]
    assert set(error_schema["required"]) == {"error", "detail"}
    for method, path, body in [("GET", "/saes/x/features/-1", None), ("GET", "/no/such", None),
                               ("POST", "/search/text", {"text": "a", "k": True}),
                               ("POST", "/search/vector", {"vector": [1.0, 2.0]})]:
        answer = httpx.request(method, server.url + path, json=body)
        assert 400 <= answer.status_code < 500
        assert set(answer.json()) <= set(error_schema["properties"]) and answer.json()["detail"], answer.text
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith("4"):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status)
            if method == "post":
                assert "413" in operation["responses"] and "422" in operation["responses"], path
