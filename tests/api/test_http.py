"""The live HTTP service (uvicorn on a loopback port): every endpoint, bad input, auth."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.api.conftest import TOKEN, free_port


@pytest.fixture(scope="module")
def http(server: Any) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def _error(response: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["detail"], body
    for needle in needles:
        assert needle in body["detail"], body
    return body


def test_health_openapi_and_explorer(http: httpx.Client) -> None:
    assert http.get("/health").json()["status"] == "ok"
    spec = http.get("/openapi.json").json()
    assert "/saes/{sae_id}/features/{index}" in spec["paths"] and "/search/text" in spec["paths"]
    page = http.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    for asset in ("/", "/static/app.js", "/static/style.css"):  # nothing loads from elsewhere
        text = http.get(asset).text
        assert "http://" not in text and "https://" not in text and "//cdn" not in text


def test_saes_features_and_searches(http: httpx.Client, small_atlas: dict[str, Any]) -> None:
    a, b = small_atlas["sae_ids"]
    saes = http.get("/saes").json()
    assert [s["sae_id"] for s in saes] == [a, b]
    assert http.get(f"/saes/{a}").json()["d_sae"] == small_atlas["d_sae"]
    page = http.get(f"/saes/{a}/features", params={"sort": "density", "limit": 5}).json()
    assert page["total"] == small_atlas["d_sae"] and len(page["rows"]) == 5
    densities = [r["density"] for r in page["rows"]]
    assert densities == sorted(densities, reverse=True)
    f = http.get(f"/saes/{a}/features/3", params={"examples": 2, "neighbours": 3}).json()
    assert f["index"] == 3 and len(f["neighbours"]) == 3 and len(f["examples"]) <= 2
    assert f["map_position"]["latent"] == 3
    assert http.get(f"/saes/{a}/features/3", headers={"Accept": "text/html"},
                    follow_redirects=False).headers["location"] == f"/#/saes/{a}/features/3"
    assert len(http.get(f"/saes/{a}/features/3/examples", params={"kind": "top"}).json()) >= 1
    similar = http.get(f"/saes/{a}/features/3/similar", params={"k": 4}).json()
    assert [s["latent"] for s in similar] == [n["latent"] for n in http.get(
        f"/saes/{a}/features/3", params={"neighbours": 4}).json()["neighbours"]]
    flow = http.get(f"/saes/{a}/features/3/flow", params={"k": 2}).json()
    assert {x["sae_id"] for x in flow} == {b} and len(flow) == 2
    themap = http.get(f"/saes/{b}/map").json()
    assert len(themap["latent"]) == small_atlas["d_sae"] and {"x", "y", "cluster"} <= set(themap)
    assert themap["basis"] == "decoder" and "cooc_x" not in themap
    vec = http.post("/search/vector", json={"vector": [0.5] * 32, "sae_id": b, "k": 3}).json()
    assert len(vec) == 3 and all(v["sae_id"] == b for v in vec)
    text = http.post("/search/text", json={"text": "the cat sat", "saes": [a], "k": 2}).json()
    assert text["tokens"] == ["the", "cat", "sat"] and len(text["features"][a]) == 3 and text["positions"] == [1, 2, 3]
    everything = http.post("/search/text", json={"text": "the cat sat", "saes": [a], "include_special": True}).json()
    assert everything["tokens"] == ["<s>", "the", "cat", "sat"] and everything["special"] == [True, False, False, False]
    token = http.get("/search/token", params={"token": "cat", "k": 3}).json()
    assert token["token"] == "cat" and len(token["promoting"]) == 3
    assert http.get(f"/search/token/{token['token_id']}").json()["token_id"] == token["token_id"]


def test_map_basis(http: httpx.Client, small_atlas: dict[str, Any]) -> None:
    """`?basis=` picks the decoder or co-occurrence map; both carry every basis' scores."""
    from sae_atlas.store.maps import read_map

    sae = small_atlas["sae_ids"][1]
    stored, meta = read_map(small_atlas["root"], sae)
    decoder = http.get(f"/saes/{sae}/map", params={"basis": "decoder"}).json()
    cooc = http.get(f"/saes/{sae}/map", params={"basis": "cooccurrence"}).json()
    assert cooc["basis"] == "cooccurrence" and cooc["latent"] == decoder["latent"]
    assert cooc["x"] == pytest.approx(stored["cooc_x"].to_list()) and decoder["x"] == pytest.approx(stored["x"].to_list())
    assert cooc["knn_overlap"] == pytest.approx(stored["cooc_knn_overlap"].to_list())
    assert cooc["cluster"] == decoder["cluster"] == stored["cluster"].to_list()
    assert cooc["scores"] == decoder["scores"] and set(cooc["scores"]) == {"decoder", "cooccurrence"}
    score = cooc["scores"]["cooccurrence"]
    assert score["knn_overlap_mean"] == pytest.approx(meta["summary"]["cooccurrence"]["knn_overlap_mean"])
    assert 0 < score["chance"] < 1 and score["other_basis_overlap_mean"] is not None
    _error(http.get(f"/saes/{sae}/map", params={"basis": "pca"}), 422, "basis")


def test_analyses_endpoints(http: httpx.Client) -> None:
    runs = http.get("/analyses").json()
    assert {"kind": "planted", "run": "demo-run", "table": "demo-run.parquet", "figures": ["demo-run.png"],
            "status": "ok", "problem": None} in runs
    result = http.get("/analyses/planted/demo-run").json()
    assert result["columns"] == ["cluster", "size", "score"] and result["n_rows"] == 2
    png = http.get("/analyses/planted/figures/demo-run.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    _error(http.get("/analyses/planted/missing-run"), 404, "demo-run")
    _error(http.post("/analyses/circular", json={"sae_id": "x"}), 403, "--allow-analyses")


@pytest.mark.parametrize("path,status,needle", [
    ("/saes/nope", 404, "valid"),
    ("/saes/nope/features/0", 404, "unknown SAE id"),
    ("/saes/..%2F..%2Fetc/features/0", 404, ""),
    ("/saes/%2E%2E/features/0", 422, "sae_id"),
    ("/saes/..%5C..%5Cetc/features/0", 422, "sae_id"),
    ("/saes/a..b", 422, "sae_id"),
    ("/saes/{a}/features/-1", 422, "index"),
    ("/saes/{a}/features/abc", 422, "index"),
    ("/saes/{a}/features/64", 404, "valid 0..63"),
    ("/saes/{a}/features/99999999999999999999", 422, "index"),
    ("/saes/{a}/features/3/similar?k=100000", 422, "k"),
    ("/saes/{a}/features/3/similar?k=0", 422, "k"),
    ("/saes/{a}/features/3/similar?k=two", 422, "k"),
    ("/saes/{a}/features/3?examples=500", 422, "examples"),
    ("/saes/{a}/features?sort=evil", 422, "sort"),
    ("/search/token", 422, "token"),
    ("/search/token/-1", 422, "token_id"),
    ("/search/token/true", 422, "token_id"),
    ("/search/token?token=zzzz-not-a-token", 404, "vocabulary"),
    ("/analyses/..%2F..%2Fetc/passwd", 404, ""),
    ("/analyses/%2E%2E/figures/atlas.json", 422, "kind"),
    ("/analyses/planted/figures/demo-run.json", 422, "name"),
    ("/analyses/planted/figures/..%2F..%2Fatlas.json", 404, ""),
    ("/no/such/endpoint", 404, "no such endpoint"),
])
def test_bad_get_requests(http: httpx.Client, small_atlas: dict[str, Any], path: str, status: int,
                          needle: str) -> None:
    response = http.get(path.replace("{a}", small_atlas["sae_ids"][0]))
    _error(response, status, needle)


@pytest.mark.parametrize("path,body,status,needle", [
    ("/search/text", {"text": ""}, 422, "text"),
    ("/search/text", {"text": "x" * 5000}, 422, "text"),
    ("/search/text", {"text": 12}, 422, "text"),
    ("/search/text", {"text": "the", "k": 1000}, 422, "k"),
    ("/search/text", {"text": "the", "saes": ["../x"]}, 422, "saes"),
    ("/search/text", {"text": "the", "sae_ids": ["../x"]}, 422, "saes"),  # the old name, checked as the new one
    ("/search/text", {"text": "the", "k": True}, 422, "k"),
    ("/search/text", {"text": "the", "k": "2"}, 422, "k"),
    ("/search/text", {"text": "the", "k": 2.5}, 422, "k"),
    ("/search/text", {"text": "the", "sae_ids": ["nope"]}, 404, "unknown SAE id"),
    ("/search/text", {"text": "the", "extra": 1}, 422, "extra"),
    ("/search/vector", {"vector": [1.0, 2.0]}, 400, "d_in is 32"),
    ("/search/vector", {"vector": ["a"] * 32}, 422, "vector"),
    ("/search/vector", {"vector": [0.0] * 32}, 400, "zero"),
    ("/search/vector", {"vector": [1.0] * 32, "k": -1}, 422, "k"),
    ("/search/vector", {"vector": [1.0] * 32, "k": True}, 422, "k"),
    ("/search/vector", {"vector": [True] * 32}, 422, "vector"),
    ("/search/vector", {"vector": [1.0] * 32, "sae_id": "nope"}, 404, "unknown SAE id"),
])
def test_bad_post_bodies(http: httpx.Client, path: str, body: dict[str, Any], status: int, needle: str) -> None:
    _error(http.post(path, json=body), status, needle)


def test_malformed_and_oversized_bodies(http: httpx.Client) -> None:
    _error(http.post("/search/text", content=b"{not json", headers={"content-type": "application/json"}), 422)
    _error(http.post("/search/vector", content=b"x" * 400_000, headers={"content-type": "application/json"}),
           413, "larger than the limit")

    def chunks() -> Any:
        for _ in range(40):
            yield b" " * 10_000

    _error(http.post("/search/text", content=chunks(), headers={"content-type": "application/json"}),
           413, "larger than the limit")
    _error(http.post("/search/text", content=b"[]", headers={"content-type": "application/json"}), 422)
    assert http.get("/health").status_code == 200  # the server survived all of it


def test_token_auth(token_server: Any, small_atlas: dict[str, Any]) -> None:
    a = small_atlas["sae_ids"][0]
    ok = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=token_server.url, timeout=30) as client:
        assert client.get("/health").json() == {"status": "ok"}  # bare liveness only
        assert client.get("/health", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ok"}
        full = client.get("/health", headers=ok).json()
        assert full["auth"] is True and full["saes"] == 2
        for path in ("/openapi.json", "/", "/static/app.js", "/saes", "/analyses/planted/figures/demo-run.png"):
            _error(client.get(path), 401, "bearer token")
        _error(client.get(f"/saes/{a}/features/0", headers={"Authorization": "Bearer wrong"}), 401)
        _error(client.get("/saes", headers={"Authorization": TOKEN}), 401)
        _error(client.post("/search/text", json={"text": "the"}), 401)
        _error(client.get("/?token=wrong"), 401)
        assert client.get("/openapi.json", headers=ok).json()["paths"]
        assert client.get("/saes", headers=ok).status_code == 200
        assert client.get(f"/saes/{a}/features/0", headers=ok).json()["index"] == 0
        _error(client.post("/analyses/circular", headers=ok, json={"sae_id": a, "max_tokens": 10}), 422, "max_tokens")
    with httpx.Client(base_url=token_server.url, timeout=30) as browser:  # the explorer: /?token= once
        assert "/static/app.js" in browser.get("/", params={"token": TOKEN}).text
        assert browser.cookies.get("sae_atlas_token") == TOKEN
        assert browser.get("/static/app.js").status_code == 200 and browser.get("/").status_code == 200
        assert browser.get("/saes").status_code == 200  # the page's links and figures


def test_health_never_names_the_atlas(http: httpx.Client, small_atlas: dict[str, Any]) -> None:
    text = http.get("/health").text
    assert small_atlas["root"].name not in text and str(small_atlas["root"]) not in text
    assert set(http.get("/health").json()) == {"status", "saes", "worker_pid", "auth", "analyses_allowed",
                                                 "interventions_allowed"}


def test_static_files_stay_in_the_explorer_folder(http: httpx.Client) -> None:
    for path in ("/static/..%2Fatlas.py", "/static/%2E%2E", "/static/missing.js", "/static/..%2F..%2Fpyproject.toml"):
        assert http.get(path).status_code == 404, path


def test_json_integers_and_extreme_vectors(http: httpx.Client, small_atlas: dict[str, Any]) -> None:
    """`3.0` is an integer in JSON Schema (so accepted as 3); a direction of huge or tiny finite
    numbers is still a direction (same answer as the unit vector)."""
    b = small_atlas["sae_ids"][1]
    unit = http.post("/search/vector", json={"vector": [0.5] * 32, "sae_id": b, "k": 3}).json()
    assert len(http.post("/search/vector", json={"vector": [0.5] * 32, "sae_id": b, "k": 3.0}).json()) == 3
    for scale in (1e300, 1e-310):
        hits = http.post("/search/vector", json={"vector": [scale] * 32, "sae_id": b, "k": 3}).json()
        assert [h["latent"] for h in hits] == [u["latent"] for u in unit], scale


def _raw_get(port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    """GET `target` over a bare socket (httpx refuses URLs this long): status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_overlong_urls_get_json_errors_from_sae_atlas_serve(small_atlas: dict[str, Any]) -> None:
    """`sae-atlas serve` runs uvicorn with `api.http.protocol`: a query string too long for the
    HTTP parser (over 65535 bytes) gets the documented 414 in the project's JSON shape, not
    uvicorn's plain text; one under it reaches the application and fails validation (422)."""
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "sae_atlas", "serve", str(small_atlas["root"]), "--port", str(port),
                              "--log-level", "error", "--threads", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None, serve.stderr.read().decode()[-2000:] if serve.stderr else ""
            assert time.monotonic() < deadline, "sae-atlas serve did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        status, headers, body = _raw_get(port, "/search/labels?q=" + "a" * 100_000)
        assert status == 414 and headers["content-type"] == "application/json", body[:200]
        answer = json.loads(body)
        assert answer["error"] == "http" and "65535" in answer["detail"], answer
        status, headers, body = _raw_get(port, "/search/labels?q=" + "a" * 60_000)
        assert status == 422 and headers["content-type"] == "application/json"
        assert json.loads(body)["error"] == "validation" and "500 characters" in json.loads(body)["detail"]
        status, _, body = _raw_get(port, "/saes/" + "x" * 70_000)
        assert status == 414 and json.loads(body)["error"] == "http"
        assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"  # and it still serves
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def test_the_url_limit_is_documented(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    for path, method in (("/search/labels", "get"), ("/saes/{sae_id}", "get"), ("/search/text", "post")):
        documented = spec["paths"][path][method]["responses"]["414"]
        assert "65535" in documented["description"] and documented["content"]["application/json"]["schema"]["$ref"]


def test_statuses_are_documented(http: httpx.Client) -> None:
    """The status values of a listed SAE or analysis run, and what /health reports of the
    unregistered ones, are in /openapi.json."""
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    for name in ("SaeStatus", "AnalysisRunFiles"):
        status = schemas[name]["properties"]["status"]
        assert status["enum"] == ["ok", "damaged", "unregistered"] and "unregistered" in status["description"], name
    health = schemas["Health"]["properties"]
    assert {"damaged_saes", "unregistered_saes", "unregistered_analyses"} <= set(health)
