"""Answers over HTTP never carry the server's paths: files are named relative to the atlas
and the atlas itself is `<atlas>` in repair commands, in error bodies and in the problems
that listings show (`sae_atlas.errors.without_root`, applied where errors become answers)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.errors import IntegrityError, NotFoundError, without_root
from sae_atlas.saes.eval.results import result_paths
from sae_atlas.store.steering import read_steering
from tests.api.small_atlas import PLANTED_KIND, PLANTED_RUN


def test_without_root_names_files_relative_and_the_atlas_as_a_placeholder(tmp_path: Path):
    root = tmp_path / "atlas"
    text = (f"{root}/saes/s/cfg.json: bad. To repair: re-run `sae-atlas eval --atlas {root} --sae s`; "
            f"no SAEs in {root}. A sibling {root}-old/x and {root}.json stay")
    assert without_root(text, root) == (f"saes/s/cfg.json: bad. To repair: re-run `sae-atlas eval --atlas <atlas> "
                                        f"--sae s`; no SAEs in <atlas>. A sibling {root}-old/x and {root}.json stay")
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    assert without_root(f"--atlas {root} and {root}/x", link) == "--atlas <atlas> and x"  # the resolved spelling
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)  # a root given relative: a bare word only as the --atlas value
        assert without_root(f"the atlas has 3 SAEs; --atlas atlas; atlas/saes/s; {root}/x", Path("atlas")) == (
            "the atlas has 3 SAEs; --atlas <atlas>; saes/s; x")
    finally:
        os.chdir(cwd)
    damaged = IntegrityError(root / "saes/s/tables.json", f"differs from {root}/saes/s/features.parquet",
                             f"re-run `sae-atlas summarize {root} --sae s`")
    assert damaged.describe(root) == ("saes/s/tables.json: differs from saes/s/features.parquet. To repair: "
                                      "re-run `sae-atlas summarize <atlas> --sae s`")


@pytest.fixture
def atlas(small_atlas: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "served"
    shutil.copytree(small_atlas["root"], root)
    return {**small_atlas, "root": root}


def _leaks(answer: Any, root: Path) -> bool:
    return str(root) in answer.text or str(root.resolve()) in answer.text


def test_http_errors_and_problems_leave_the_server_paths_out(atlas: dict[str, Any]):
    root, (first, second) = atlas["root"], atlas["sae_ids"]
    (root / "saes" / second / "features.parquet").write_bytes(b"damaged")
    orphan, _ = result_paths(root, first, "core")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_text("{}")  # a result without its sidecar
    with TestClient(create_app(ServerSettings(root=root, allow_interventions=True))) as http:
        missing = http.get("/steering/search", params={"token": "cat", "saes": first})
        assert missing.status_code == 404, missing.text
        assert f"`sae-atlas steering-scores <atlas> --sae {first}`" in missing.json()["detail"]
        assert not _leaks(missing, root)
        with pytest.raises(NotFoundError, match=f"steering-scores {root} --sae"):  # Python callers keep the real path
            read_steering(root, first)
        damaged = http.get(f"/saes/{second}/features/0")
        assert damaged.status_code == 500, damaged.text
        body = damaged.json()
        assert body["path"] == f"saes/{second}/features.parquet" and body["detail"].startswith(body["path"])
        assert body["repair"] == f"re-run `sae-atlas summarize <atlas> --sae {second}`"
        assert not _leaks(damaged, root)
        board = http.get("/board")
        assert board.status_code == 200 and not _leaks(board, root)
        [row] = [r for r in board.json()["rows"] if r["sae_id"] == first]
        assert row["status"] == "damaged" and f"eval <atlas> --sae {first} --suite core" in row["problem"]
        listing = http.get("/saes")
        assert listing.status_code == 200 and not _leaks(listing, root)
        assert "summarize <atlas>" in str(listing.json())


def _filled(path: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


def test_no_get_answer_carries_the_atlas_path(atlas: dict[str, Any]):
    """Every GET route of the OpenAPI schema, its path parameters filled with what the atlas
    holds, over an atlas whose listings carry repair commands (an SAE atlas.json no longer
    lists, a damaged SAE, an eval result without its sidecar, an unregistered analysis run):
    the atlas's absolute path is in no answer, success or error."""
    root, (first, second) = atlas["root"], atlas["sae_ids"]
    meta = json.loads((root / "atlas.json").read_text())
    del meta["saes"][first]  # unregistered
    (root / "atlas.json").write_text(json.dumps(meta))
    (root / "saes" / second / "features.parquet").write_bytes(b"damaged")
    orphan, _ = result_paths(root, second, "core")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_text("{}")
    runs = root / "analyses" / PLANTED_KIND / "runs.json"
    index = json.loads(runs.read_text())
    del index["runs"][PLANTED_RUN]  # unregistered
    runs.write_text(json.dumps(index))
    values = {"sae_id": first, "index": "0", "token_id": "0", "kind": PLANTED_KIND, "run": PLANTED_RUN,
              "name": f"{PLANTED_RUN}.png", "eval_name": "core", "comparison": "nope", "side": "a", "crosscoder": "nope"}
    query = {"token": "the", "query": "the"}
    with TestClient(create_app(ServerSettings(root=root, allow_interventions=True))) as http:
        paths = [p for p, ops in http.get("/openapi.json").json()["paths"].items() if "get" in ops]
        answers = {p: http.get(_filled(p, values), params=query) for p in paths}
        for sae_id in (first, second):  # the per-SAE routes of the damaged SAE too
            answers |= {f"{p} ({sae_id})": http.get(_filled(p, {**values, "sae_id": sae_id}), params=query)
                        for p in paths if "{sae_id}" in p}
    assert len(paths) >= 20 and "/health" in answers and "/saes/{sae_id}/evals/{eval_name}" in answers
    leaked = [p for p, answer in answers.items() if _leaks(answer, root)]
    assert not leaked, {p: answers[p].text[:300] for p in leaked}
    ok = [p for p, answer in answers.items() if answer.status_code == 200]
    assert {"/health", "/saes", "/board", "/analyses", "/saes/{sae_id}/features (" + first + ")"} <= set(ok)
    commands = [p for p in ok if "sae-atlas " in answers[p].text and " <atlas>" in answers[p].text]
    assert {"/health", "/saes", "/board", "/analyses"} <= set(commands), commands


def test_an_error_event_of_a_stream_leaves_the_server_paths_out(tmp_path: Path):
    from concurrent.futures import ThreadPoolExecutor

    from fastapi import FastAPI

    from sae_atlas.api.http.sse import event_stream

    root = tmp_path / "atlas"
    app = FastAPI()
    queue = ThreadPoolExecutor(max_workers=1)

    def events() -> Any:
        yield "token", ["a"]
        raise IntegrityError(root / "saes/s/sae_weights.safetensors", "truncated", f"re-import --atlas {root}")

    app.get("/stream")(lambda: event_stream(queue, events(), root))
    with TestClient(app) as http:
        text = http.get("/stream").text
    queue.shutdown()
    assert "event: token" in text and "event: error" in text and str(root) not in text
    assert '"path": "saes/s/sae_weights.safetensors"' in text.replace('":"', '": "')
    assert "re-import --atlas <atlas>" in text
