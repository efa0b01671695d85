"""Steering over HTTP on the small atlas: `POST /steer/stream` read as it arrives from the
live server (the streamed tokens are `POST /steer`'s, they arrive while the model is still
generating, and a client that leaves stops the generation), and `GET/POST /steering/search`
(`Atlas.steering_features` over HTTP, its bounds and errors)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http import sse
from sae_atlas.saes.intervene.decode import CachedDecoder
from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores
from tests.api.conftest import LiveServer

TEXT = "the cat sat on the mat"
WAIT = 60  # seconds a gated decoding step waits before the test fails
SEARCH = {"k": 3, "n_prompts": 4, "candidates": 4}  # a small search: 4 held-out prompts, 4 candidates


def add_steering_tables(root: Path, sae_ids: list[str]) -> None:
    """Small steering tables (4 prompts of 6 tokens) for `sae_ids` of the atlas at `root`."""
    atlas = Atlas(root)
    for sae_id in sae_ids:
        compute_steering_scores(atlas.model(), root, sae_id, SteeringParams(n_prompts=4, prompt_tokens=6, chunk=64),
                                progress=False)


@pytest.fixture(scope="module")
def live(small_atlas: dict[str, Any]) -> Iterator[LiveServer]:
    with LiveServer(small_atlas["root"], allow_interventions=True) as server:
        yield server


@pytest.fixture(scope="module")
def steer_body(small_atlas: dict[str, Any]) -> dict[str, Any]:
    """A greedy steer of a feature that fires at the prompt's last token."""
    sae = small_atlas["sae_ids"][1]
    feature = int(Atlas(small_atlas["root"]).run(TEXT, saes=[sae]).codes[sae][-1].argmax())
    return {"text": TEXT, "edits": [{"kind": "steer", "sae": sae, "feature": feature, "alpha": 30.0}],
            "max_new_tokens": 12, "temperature": 0.0, "seed": 7}


def events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event name, parsed data) of a text/event-stream, as its lines arrive."""
    name, data = None, []
    for line in lines:
        if line == "":
            if name is not None:
                yield name, json.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data.append(line.removeprefix("data: "))


class GatedSteps:
    """`CachedDecoder.step` patched: counts each decoder's steps, and before step `at`
    waits until `release()` returns true (a test fails if it never does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int, release: Any) -> None:
        self.counts: dict[int, int] = {}
        self.order: list[int] = []
        self.waited = threading.Event()
        original = CachedDecoder.step

        def step(decoder: CachedDecoder, next_B: Any) -> Any:
            key = id(decoder)
            if key not in self.counts:
                self.order.append(key)
            self.counts[key] = self.counts.get(key, 0) + 1
            if len(self.order) == 1 and self.counts[key] == at:
                for _ in range(WAIT * 20):
                    if release():
                        self.waited.set()
                        break
                    threading.Event().wait(0.05)
            return original(decoder, next_B)

        monkeypatch.setattr(CachedDecoder, "step", step)

    def first(self) -> int:
        """Steps the first decoder (the streamed generation) ran."""
        return self.counts[self.order[0]]


def test_streamed_tokens_arrive_while_generating_and_equal_steer(live: LiveServer, steer_body: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    whole = httpx.post(live.url + "/steer", json=steer_body, timeout=60)
    assert whole.status_code == 200, whole.text
    expected = whole.json()
    seen: list[dict[str, Any]] = []
    gate = GatedSteps(monkeypatch, at=3, release=lambda: len(seen) >= 3)  # step 3 waits for 3 tokens read
    got: dict[str, Any] = {}
    with httpx.stream("POST", live.url + "/steer/stream", json=steer_body, timeout=WAIT + 30) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        for name, data in events(answer.iter_lines()):
            if name == "token":
                assert data["step"] == len(seen)
                seen.append(data)
            else:
                got[name] = data
    assert gate.waited.is_set()  # three tokens were read before the fourth was decoded
    assert set(got) == {"done"} and got["done"] == expected
    for side in ("baseline", "edited"):
        pieces = [s[side] for s in seen if s[side] is not None]
        assert [p["token_id"] for p in pieces] == expected[f"{side}_ids"]
        assert "".join(p["text"] for p in pieces) == expected[f"{side}_text"]
    assert len(seen) == max(len(expected["baseline_ids"]), len(expected["edited_ids"]))
    assert expected["baseline_ids"] != expected["edited_ids"]  # the edit does steer


def test_a_client_that_leaves_stops_the_generation(live: LiveServer, steer_body: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[threading.Event] = []

    class RecordedEvent(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            stops.append(self)

    monkeypatch.setattr(sse, "Event", RecordedEvent)
    body = {**steer_body, "max_new_tokens": 40}
    gate = GatedSteps(monkeypatch, at=3, release=lambda: bool(stops) and stops[0].is_set())
    with httpx.stream("POST", live.url + "/steer/stream", json=body, timeout=WAIT + 30) as answer:
        for n, (name, _) in enumerate(events(answer.iter_lines())):
            assert name == "token"
            if n == 1:
                break  # leave after two tokens: closing the stream closes the connection
    after = httpx.post(live.url + "/steer", json=body, timeout=WAIT + 30)  # queued behind the stream's work
    assert after.status_code == 200, after.text
    assert gate.first() <= 3  # step 3 waits for the server to see the client leave; nothing after it (of 40)
    monkeypatch.undo()
    assert after.json() == httpx.post(live.url + "/steer", json=body, timeout=60).json()  # no edit hook left over


@pytest.mark.parametrize("body,status,needle", [
    ({"max_new_tokens": 10_000}, 422, "max_new_tokens"),
    ({"temperature": 50.0}, 422, "temperature"),
    ({"edits": []}, 422, "edits"),
    ({"text": " ".join(["cat"] * 300)}, 400, "maximum is"),
    ({"edits": [{"kind": "steer", "sae": "nope", "feature": 0, "alpha": 1.0}]}, 404, "nope"),
    ({"edits": [{"kind": "steer", "sae": "SID", "feature": 99999, "alpha": 1.0}]}, 404, "out of range"),
])
def test_bad_stream_requests_are_json_errors(live: LiveServer, steer_body: dict[str, Any], body: dict[str, Any],
                                             status: int, needle: str) -> None:
    request = json.loads(json.dumps({**steer_body, **body}).replace("SID", steer_body["edits"][0]["sae"]))
    answer = httpx.post(live.url + "/steer/stream", json=request, timeout=60)
    assert answer.status_code == status and answer.headers["content-type"] == "application/json", answer.text
    assert needle in answer.json()["detail"]


def test_stream_is_off_without_interventions(server: LiveServer, steer_body: dict[str, Any]) -> None:
    answer = httpx.post(server.url + "/steer/stream", json=steer_body, timeout=30)
    assert answer.status_code == 403 and "--allow-interventions" in answer.json()["detail"]


def test_python_stream_equals_steer_and_frees_the_model_when_closed(small_atlas: dict[str, Any],
                                                                     steer_body: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    kwargs = {k: steer_body[k] for k in ("max_new_tokens", "temperature", "seed")}
    stream = atlas.steer_stream(TEXT, steer_body["edits"], **kwargs)
    steps = list(stream)
    whole = atlas.steer(TEXT, steer_body["edits"], **kwargs)
    assert stream.result.to_dict() == whole.to_dict()
    assert [s["edited"]["token_id"] for s in steps if s["edited"]] == whole.edited_ids
    early = atlas.steer_stream(TEXT, steer_body["edits"], **kwargs)
    running = iter(early)
    next(running)
    assert atlas.ctx.model_lock.locked()
    running.close()
    assert not atlas.ctx.model_lock.locked()
    with pytest.raises(RuntimeError, match="not run to its end"):
        _ = early.result
    assert atlas.steer(TEXT, steer_body["edits"], **kwargs).to_dict() == whole.to_dict()  # hooks removed


# ---------------------------------------------------------------- /steering/search


@pytest.fixture(scope="module")
def steering_atlas(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas with a steering table for its second SAE only."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path_factory.mktemp("steering") / "atlas"))
    add_steering_tables(root, small_atlas["sae_ids"][1:])
    return {**small_atlas, "root": root}


@pytest.fixture(scope="module")
def steering_live(steering_atlas: dict[str, Any]) -> Iterator[LiveServer]:
    with LiveServer(steering_atlas["root"], allow_interventions=True) as server:
        yield server


def test_search_answers_what_the_facade_ranks_and_its_edit_streams(steering_live: LiveServer,
                                                                    steering_atlas: dict[str, Any]) -> None:
    sae = steering_atlas["sae_ids"][1]
    expected = Atlas(steering_atlas["root"]).steering_features("cat", saes=[sae], **SEARCH).to_dict()
    got = httpx.post(steering_live.url + "/steering/search", timeout=60,
                     json={"target": {"kind": "tokens", "tokens": ["cat"]}, "saes": [sae], **SEARCH})
    assert got.status_code == 200, got.text
    assert got.json() == expected
    assert [f["rank"] for f in expected["features"]] == [1, 2, 3] and expected["tokens"] == ["cat"]
    keys = [(f["confirmed"]["share_specific"], f["confirmed"]["score"]) for f in expected["features"]]
    assert keys == sorted(keys, reverse=True)  # ranked on the held-out confirmation prompts
    by_get = httpx.get(steering_live.url + "/steering/search", timeout=60,
                       params={"token": "cat", "sae_id": sae, "k": 3})  # the default search (the old `sae_id`)
    assert by_get.status_code == 200, by_get.text
    assert by_get.json()["n_prompts"] == 16 and len(by_get.json()["features"]) == 3
    options = {**SEARCH, "styles": ["neutral", "question"], "combine": 0, "ratio": 2.0}  # every option as in Python
    narrow = Atlas(steering_atlas["root"]).steering_features("cat", saes=[sae], **options).to_dict()
    by_query = httpx.get(steering_live.url + "/steering/search", timeout=60,
                         params={"token": "cat", "saes": [sae], **options})
    assert by_query.status_code == 200, by_query.text
    assert by_query.json() == narrow and narrow["combination"] is None
    assert set(narrow["prompt_counts"]["confirm"]) == {"neutral", "question"}
    best = expected["features"][0]["edit"]  # the explorer's click: the ranked edit, generated and streamed
    body = {"text": TEXT, "edits": [best], "max_new_tokens": 4}
    with httpx.stream("POST", steering_live.url + "/steer/stream", json=body, timeout=60) as answer:
        streamed = dict(events(answer.iter_lines()))
    assert streamed["done"] == httpx.post(steering_live.url + "/steer", json=body, timeout=60).json()


@pytest.mark.parametrize("method,request_args,status,needle", [
    ("GET", {"params": {"token": "zzzz-not-a-token"}}, 400, "vocabulary"),
    ("POST", {"json": {"target": {"kind": "tokens", "tokens": [10**6]}}}, 400, "outside the vocabulary"),
    ("GET", {"params": {"token": "cat", "saes": "SAE0"}}, 404, "steering-scores"),
    ("GET", {"params": {"token": "cat", "saes": "nope"}}, 404, "nope"),
    ("GET", {"params": {"token": "cat", "k": 0}}, 422, "k"),
    ("GET", {"params": {"token": "cat", "ratio": 1}}, 422, "ratio"),
    ("GET", {"params": {"token": "cat", "mode": "multiply"}}, 422, "mode"),
    ("GET", {"params": {"token": "x" * 65}}, 422, "token"),
    ("POST", {"json": {"target": "cat", "n_prompts": 1000}}, 422, "n_prompts"),
    ("POST", {"json": {"target": "cat", "candidates": 10_000}}, 422, "candidates"),
    ("POST", {"json": {"target": "cat", "kl_bound": 0}}, 422, "kl_bound"),
    ("POST", {"json": {"target": {"kind": "contrast", "texts_a": [], "texts_b": ["a dog"]}}}, 422, "texts_a"),
    ("POST", {"json": {"target": {"kind": "concept", "concept": "/etc/passwd"}}}, 422, "concept"),
    ("POST", {"json": {"target": {"kind": "tokens", "tokens": ["cat"] * 65}}}, 422, "tokens"),
    ("POST", {"json": {"target": "cat", "extra": 1}}, 422, "extra"),
    ("POST", {"json": {"target": "cat", "styles": ["telepathy"]}}, 422, "styles"),
    ("POST", {"json": {"target": "cat", "styles": ["user"], "prompts": ["a cat", "the dog", "a cow"]}}, 400,
     "the confirmation set would hold 1"),
])
def test_bad_searches_are_named(steering_live: LiveServer, steering_atlas: dict[str, Any], method: str,
                                request_args: dict[str, Any], status: int, needle: str) -> None:
    args = json.loads(json.dumps(request_args).replace("SAE0", steering_atlas["sae_ids"][0]))
    served = steering_atlas["sae_ids"][1]  # the SAE with a steering table, unless the case names another
    if method == "POST":
        args["json"] = {"saes": [served], **args["json"]}
    else:
        args["params"] = {"saes": served, **args["params"]}
    answer = httpx.request(method, steering_live.url + "/steering/search", timeout=60, **args)
    assert answer.status_code == status, answer.text
    assert needle in answer.json()["detail"]


def test_search_is_off_without_interventions(server: LiveServer) -> None:
    for answer in (httpx.get(server.url + "/steering/search", params={"token": "cat"}, timeout=30),
                   httpx.post(server.url + "/steering/search", json={"target": "cat"}, timeout=30)):
        assert answer.status_code == 403 and "--allow-interventions" in answer.json()["detail"]
