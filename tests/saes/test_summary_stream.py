"""Summaries streamed from the model equal summaries of a cache of the same tokens; they
resume after a crash or kill -9, and 2 torchrun ranks (gloo) equal one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import sae_atlas.saes.streaming as streaming
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.summary.accumulator import SummaryParams
from sae_atlas.saes.summary.run import summarize_blocks, summary_record, write_summary
from sae_atlas.saes.summary.stream import STATE_DIR, summarize_from_model
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import OccurrenceWriter, load_occurrence
from tests.saes.stream_fixture import BATCH_BLOCKS, CORPUS, N_TOKENS, SAES, make_atlas, tiny

REPO = Path(__file__).resolve().parents[2]


def tables(root: Path, sae_id: str) -> dict[str, object]:
    folder = AtlasLayout(root).sae_dir(sae_id)
    matrix, blocks = load_occurrence(root, sae_id)
    return {"features": pl.read_parquet(folder / "features.parquet"),
            "examples": pl.read_parquet(folder / "examples.parquet"),
            "occurrence": matrix.toarray(), "blocks": blocks}


def assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    assert_frame_equal(a["features"], b["features"])
    assert_frame_equal(a["examples"], b["examples"])
    assert (a["occurrence"] == b["occurrence"]).all() and (a["blocks"] == b["blocks"]).all()


def run_stream(root: Path, **kw: object) -> list:
    return summarize_from_model(tiny(), root, corpus=CORPUS, n_tokens=N_TOKENS, batch_blocks=BATCH_BLOCKS,
                                progress=False, **kw)


def test_streamed_tables_equal_cached_tables(tmp_path: Path) -> None:
    handle = make_atlas(tmp_path)
    reports = run_stream(tmp_path, checkpoint_every=3)
    assert [r.sae_id for r in reports] == list(SAES) and not any(r.skipped for r in reports)
    assert not (tmp_path / STATE_DIR).exists() or not any((tmp_path / STATE_DIR).iterdir())
    streamed = {sae_id: tables(tmp_path, sae_id) for sae_id in SAES}
    assert all(r.skipped for r in run_stream(tmp_path))  # the same arguments again: nothing to do
    for sae_id, hook in SAES.items():
        sae = load_atlas_sae(tmp_path, sae_id)
        occurrence = OccurrenceWriter(tmp_path, sae_id, sae.cfg.d_sae)
        acc = summarize_blocks(sae, ActivationReader(tmp_path, hook).blocks("all"), SummaryParams(),
                               batch_tokens=BATCH_BLOCKS * CORPUS.context_size, occurrence=occurrence)
        occurrence.finish()
        W_U = handle.W_U.detach()  # noqa: N806
        record = summary_record(sae, hook, SummaryParams(), {"split": "all"}, W_U, handle.final_norm_kind)
        write_summary(tmp_path, sae_id, sae, acc, record, 0.0, W_U=W_U, final_norm_weight=handle.final_norm_weight,
                      norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer)
        cached = tables(tmp_path, sae_id)
        assert cached["features"]["n_active"].sum() > 100 and cached["examples"].height > 100
        assert_same(streamed[sae_id], cached)


def test_crash_mid_stream_resumes_to_identical_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    make_atlas(full, with_cache=False)
    make_atlas(crashed, with_cache=False)
    run_stream(full, checkpoint_every=2)
    calls = {"n": 0}
    real = streaming.run_hooks

    def dies_at_batch_6(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 6:  # checkpoints after batches 2 and 4; batch 5 is lost
            raise RuntimeError("simulated crash")
        return real(*args)

    monkeypatch.setattr(streaming, "run_hooks", dies_at_batch_6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_stream(crashed, checkpoint_every=2)
    monkeypatch.setattr(streaming, "run_hooks", real)
    calls["n"] = 0
    resumed = []
    monkeypatch.setattr(streaming, "run_hooks", lambda *a: resumed.append(1) or real(*a))
    run_stream(crashed, checkpoint_every=2)
    assert len(resumed) == 3  # batches 5, 6, 7 only
    for sae_id in SAES:
        assert_same(tables(crashed, sae_id), tables(full, sae_id))


def test_kill_9_mid_stream_resumes_to_identical_tables(tmp_path: Path) -> None:
    full, killed = tmp_path / "full", tmp_path / "killed"
    make_atlas(full, with_cache=False)
    make_atlas(killed, with_cache=False)
    code = ("import sys; from tests.saes.stream_fixture import *; from sae_atlas.saes.summary.stream import summarize_from_model;"
            "summarize_from_model(tiny(), sys.argv[1], corpus=CORPUS, n_tokens=N_TOKENS * 6, "
            "batch_blocks=BATCH_BLOCKS, checkpoint_every=1, progress=False)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(killed)], cwd=REPO, env=env)
    deadline = time.time() + 120
    while not list((killed / STATE_DIR).glob("*/rank-0000.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    # the killed run covers 6x the tokens; resume a run over the same tokens and compare
    # with an uninterrupted one
    summarize_from_model(tiny(), killed, corpus=CORPUS, n_tokens=N_TOKENS * 6, batch_blocks=BATCH_BLOCKS,
                         checkpoint_every=1, progress=False)
    summarize_from_model(tiny(), full, corpus=CORPUS, n_tokens=N_TOKENS * 6, batch_blocks=BATCH_BLOCKS,
                         checkpoint_every=7, progress=False)
    for sae_id in SAES:
        assert_same(tables(killed, sae_id), tables(full, sae_id))


def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    solo, dist = tmp_path / "solo", tmp_path / "dist"
    make_atlas(solo, with_cache=False)
    make_atlas(dist, with_cache=False)
    run_stream(solo, checkpoint_every=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.stream_worker", str(dist)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for sae_id in SAES:
        a, b = tables(dist, sae_id), tables(solo, sae_id)
        # float64 sums differ only by the order of additions across ranks
        sums = ("mean_act", "mean_active_act")
        assert_frame_equal(a["features"].drop(sums), b["features"].drop(sums))
        assert_frame_equal(a["features"].select(sums), b["features"].select(sums), rel_tol=1e-12)
        assert_frame_equal(a["examples"], b["examples"])
        assert (a["occurrence"] == b["occurrence"]).all() and (a["blocks"] == b["blocks"]).all()


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    make_atlas(tmp_path, with_cache=False)
    with pytest.raises(InvalidInputError, match="less than one block"):
        summarize_from_model(tiny(), tmp_path, corpus=CORPUS, n_tokens=8)
    short = tmp_path / "short.txt"
    short.write_text("the cat sat on the mat . " * 20)
    with pytest.raises(InvalidInputError, match="gave only 9 blocks of 16 tokens"):
        summarize_from_model(tiny(), tmp_path, corpus=CorpusSpec(source=str(short), context_size=16),
                             n_tokens=16 * 100, progress=False)


def test_cli_from_model_writes_the_streamed_tables(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    make_atlas(tmp_path, with_cache=False)
    result = CliRunner().invoke(app, ["summarize", str(tmp_path), "--from-model", "--tokens", str(N_TOKENS),
                                      "--context", "16", "--batch-blocks", str(BATCH_BLOCKS), "--device", "cpu",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert [r["skipped"] for r in json.loads(result.output)] == [False, False]
    assert all(r.skipped for r in run_stream(tmp_path))  # the library call with the same arguments
    missing = CliRunner().invoke(app, ["summarize", str(tmp_path), "--from-model"])
    assert missing.exit_code == 2 and "needs --tokens" in missing.output
