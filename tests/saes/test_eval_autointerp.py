"""The autointerp eval: the SAEBench result layout with the lexical proxy (named as such),
resume and stale tables, the `openai` back-end against a local fake chat-completions server,
the refusal of an endpoint that does not answer, and the CLI options."""

import json
import re
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.autointerp import AutointerpConfig, autointerp_config
from sae_atlas.saes.eval.autointerp_backends import KEY_ENV, LEXICAL_PROXY, read_verdicts
from sae_atlas.saes.eval.results import SAEBENCH_KEYS, read_result, result_paths
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import EXAMPLES_FILE, OccurrenceWriter, write_tables
from tests.saes.autointerp_planted import PLANTED, planted_examples, planted_features
from tests.store.sae_folders import write_sae

HOOK = "blocks.0.hook_resid_post"


def no_model():
    raise InvalidInputError("these tests run no model")


@pytest.fixture
def atlas(tmp_path):
    """An atlas with one SAE `s` whose summary holds the planted single-token latents."""
    n = len(PLANTED)
    write_sae(tmp_path, "s", np.eye(n, dtype=np.float32), HOOK)
    occurrence = OccurrenceWriter(tmp_path, "s", n)
    occurrence.append(np.array([0]), np.ones((1, n), dtype=np.int64))
    occurrence.finish()
    write_tables(tmp_path, "s", planted_features(), planted_examples(), {"top_k": 12})
    (tmp_path / "atlas.json").write_text(json.dumps({"model": "planted"}))  # what `cache` writes first
    return tmp_path


class FakeChat(BaseHTTPRequestHandler):
    """A deterministic stand-in for an OpenAI-compatible server: it explains by the most
    often marked token and judges by that token, as a model that reads the text would."""

    seen_keys: list[str] = []

    def log_message(self, *args):
        pass

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({"object": "list", "data": [{"id": "fake"}]})

    def do_POST(self):
        assert self.path == "/v1/chat/completions"
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeChat.seen_keys.append(self.headers.get("Authorization", ""))
        prompt = request["messages"][-1]["content"]
        excerpts = re.findall(r"^\d+\. (.*)$", prompt, flags=re.M)
        if "explained as:" not in prompt:
            word = Counter(m.strip() for text in excerpts for m in re.findall(r"<<(.*?)>>", text)).most_common(1)[0][0]
            answer = f"The word {word}"
        else:
            word = prompt.split("explained as: The word ")[1].split("\n")[0]
            if "Are the marked tokens" in prompt:
                verdicts = [int(all(m.strip() == word for m in re.findall(r"<<(.*?)>>", t)) and "<<" in t)
                            for t in excerpts]
            else:
                verdicts = [int(f" {word}" in t) for t in excerpts]
            answer = f"Here you go: {json.dumps(verdicts)}"
        self._reply({"choices": [{"message": {"role": "assistant", "content": answer}}]})


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeChat.seen_keys.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_lexical_result_in_saebench_layout_named_as_a_lexical_proxy(atlas):
    run = run_suite(atlas, ["s"], ["autointerp"], {}, device="cpu", model=no_model, progress=False)
    assert not run.failures
    path, sidecar = result_paths(atlas, "s", "autointerp")
    assert path == AtlasLayout(atlas).sae_dir("s") / "evals" / "autointerp.json" and sidecar.exists()
    result = read_result(atlas, "s", "autointerp")
    assert set(result) == set(SAEBENCH_KEYS) and result["eval_type_id"] == "autointerp"
    assert result["eval_config"]["backend"] == "lexical" and result["eval_config"]["n_latents"] == 32
    metrics = result["eval_result_metrics"]
    assert metrics["autointerp"]["backend"] == LEXICAL_PROXY == result["eval_result_unstructured"]["backend"]
    assert metrics["autointerp"]["n_latents"] == len(PLANTED) and result["eval_result_unstructured"]["skipped_latents"] == []
    assert metrics["autointerp"]["autointerp_score"] >= 0.95
    for scorer in ("detection", "fuzzing"):
        assert set(metrics[scorer]) == {f"{scorer}_{key}" for key in ("balanced_accuracy", "f1", "auc")}
        assert metrics[scorer][f"{scorer}_balanced_accuracy"] >= 0.95
    details = result["eval_result_details"]
    assert [row["latent"] for row in details] == list(range(len(PLANTED)))
    assert [row["explanation"] for row in details] == [f'fires on "{w.strip()}"' for w in PLANTED]
    assert all(row["fuzzing_failed"] == 0 for row in details)

    again = run_suite(atlas, ["s"], ["autointerp"], {}, device="cpu", model=no_model, progress=False)
    assert again.kept == [("s", "autointerp")]
    fewer = AutointerpConfig(n_latents=2)
    other = run_suite(atlas, ["s"], ["autointerp"], {"autointerp": fewer}, device="cpu", model=no_model, progress=False)
    assert not other.kept and other.results["s"]["autointerp"]["eval_result_metrics"]["autointerp"]["n_latents"] == 2


def test_rebuilt_tables_recompute_and_damaged_ones_fail_keeping_the_earlier_result(atlas):
    first = run_suite(atlas, ["s"], ["autointerp"], {}, device="cpu", model=no_model, progress=False)
    write_tables(atlas, "s", planted_features(), planted_examples(seed=1), {"top_k": 12})
    rebuilt = run_suite(atlas, ["s"], ["autointerp"], {}, device="cpu", model=no_model, progress=False)
    assert not rebuilt.kept and not rebuilt.failures
    assert rebuilt.results["s"]["autointerp"]["eval_id"] != first.results["s"]["autointerp"]["eval_id"]
    (AtlasLayout(atlas).sae_dir("s") / EXAMPLES_FILE).write_bytes(b"garbage")
    run = run_suite(atlas, ["s"], ["autointerp"], {}, device="cpu", model=no_model, force=True, progress=False)
    assert "IntegrityError" in run.failures[("s", "autointerp")]
    assert read_result(atlas, "s", "autointerp")["eval_id"] == rebuilt.results["s"]["autointerp"]["eval_id"]


def test_openai_backend_against_a_local_chat_server(atlas, chat_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "secret-key")
    config = autointerp_config("openai", url=chat_server, model="fake", n_latents=3)
    run = run_suite(atlas, ["s"], ["autointerp"], {"autointerp": config}, device="cpu", model=no_model,
                    progress=False)
    assert not run.failures, run.failures
    result = run.results["s"]["autointerp"]
    assert result["eval_config"]["backend"] == "openai" and result["eval_config"]["url"] == chat_server
    assert "secret-key" not in json.dumps(result)
    assert set(FakeChat.seen_keys) == {"Bearer secret-key"}
    metrics = result["eval_result_metrics"]
    assert metrics["autointerp"]["backend"] == f"LLM fake at {chat_server}"
    assert LEXICAL_PROXY not in json.dumps(result)
    assert metrics["autointerp"]["n_latents"] == 3
    for scorer in ("detection", "fuzzing"):
        assert metrics[scorer][f"{scorer}_balanced_accuracy"] >= 0.95 and metrics[scorer][f"{scorer}_auc"] is None
    assert all(row["explanation"].startswith("The word ") for row in result["eval_result_details"])


def test_an_endpoint_that_does_not_answer_is_refused_before_any_work(atlas):
    url = closed_url()
    with pytest.raises(InvalidInputError, match=f"autointerp endpoint {re.escape(url)} does not answer"):
        autointerp_config("openai", url=url, model="m")
    with pytest.raises(InvalidInputError, match="needs --autointerp-url and --autointerp-model"):
        autointerp_config("openai", url=url)
    with pytest.raises(InvalidInputError, match="valid: lexical, openai"):
        autointerp_config("gpt")
    app = typer.Typer()
    from sae_atlas.api.commands import eval as eval_command

    eval_command.register(app)
    app.command("noop")(lambda: None)
    refused = CliRunner().invoke(app, ["eval", str(atlas), "--suite", "core,autointerp", "--no-model",
                                       "--autointerp-backend", "openai", "--autointerp-url", url,
                                       "--autointerp-model", "m"])
    assert refused.exit_code == 2 and "does not answer" in refused.output
    assert not (AtlasLayout(atlas).sae_dir("s") / "evals").exists()


def test_cli_runs_autointerp_with_the_lexical_proxy(atlas):
    app = typer.Typer()
    from sae_atlas.api.commands import eval as eval_command

    eval_command.register(app)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    args = ["eval", str(atlas), "--suite", "autointerp", "--autointerp-latents", "2"]
    printed = runner.invoke(app, [*args, "--json"])
    assert printed.exit_code == 0, printed.output
    result = json.loads(printed.output)["s"]["autointerp"]
    assert result["eval_result_metrics"]["autointerp"]["n_latents"] == 2
    table = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert table.exit_code == 0 and LEXICAL_PROXY in table.output
    assert all(name in table.output for name in ("autointerp_score", "detection_f1", "fuzzing_balanced_accuracy"))


def test_read_verdicts_takes_the_first_list_of_the_right_length():
    assert read_verdicts("no list here", 2) == [None, None]
    assert read_verdicts("[1, 0, 1] then [0, 1]", 2) == [False, True]
    assert read_verdicts("[yes, no] [1, 1]", 2) == [True, True]
