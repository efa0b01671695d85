"""kill -9 at named points of the meta, absorption, scr, tpp and autointerp evals; re-running
the suite leaves exactly the files of an uninterrupted run.

Each killed run is a child process that SIGKILLs itself at a monkeypatched call
(`tests.saes.kill_points`): while the eval computes, half-way through the temporary file of
its result (the rename never happens; the re-run removes it), and after the result is in
place but before its sidecar (the re-run finds no finished result and writes both again).
Fields that legitimately differ between two runs are dropped where named: the result's
`eval_id` (a random uuid) and `datetime_epoch_millis`, the meta eval's
`train_time_seconds`, and the sidecar's `seconds` and `sha256` (of the result, which holds
the id and time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.absorption import AbsorptionConfig
from sae_atlas.saes.eval.meta import MetaConfig
from sae_atlas.saes.eval.scr_tpp import ScrTppConfig
from sae_atlas.saes.eval.spec import EvalName
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import OccurrenceWriter, write_tables
from tests.saes.autointerp_planted import PLANTED, planted_examples, planted_features
from tests.saes.kill_points import KillPoint, killed_then_resumed, uninterrupted
from tests.saes.planted import one_thread  # noqa: F401
from tests.store.sae_folders import write_sae

HOOK = "blocks.1.hook_resid_post"
SAE = "s"
CONFIGS: dict[EvalName, Any] = {"meta": MetaConfig(train_steps=20, train_batch_size=32),
                                "absorption": AbsorptionConfig(max_k_value=3),
                                "scr": ScrTppConfig(per_group=8, max_tokens=24),
                                "tpp": ScrTppConfig(per_group=8, max_tokens=24)}


def _timed(name: EvalName) -> dict[str, tuple[str, ...]]:
    folder = f"saes/{SAE}/evals"
    result = ("eval_id", "datetime_epoch_millis") + (
        ("eval_result_metrics.meta_structure.train_time_seconds",) if name == "meta" else ())
    return {f"{folder}/{name}.json": result, f"{folder}/{name}.sha256.json": ("seconds", "sha256")}


def _no_model() -> Any:
    raise InvalidInputError("the autointerp eval's lexical proxy runs no model")


def _suite(root: Path, name: EvalName) -> None:
    model = _no_model if name == "autointerp" else (lambda: tiny_model(n_layers=2, d_model=32, seed=3))
    done = run_suite(root, [SAE], [name], {name: CONFIGS[name]} if name in CONFIGS else {}, device="cpu",
                     model=model, progress=False)
    assert not done.failures, done.failures


def meta_job(root: Path) -> None:
    _suite(root, "meta")


def absorption_job(root: Path) -> None:
    _suite(root, "absorption")


def scr_job(root: Path) -> None:
    _suite(root, "scr")


def tpp_job(root: Path) -> None:
    _suite(root, "tpp")


def autointerp_job(root: Path) -> None:
    _suite(root, "autointerp")


@pytest.fixture(scope="module")
def model_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One random TopK SAE of the tiny model's layer 1 (meta, absorption, scr, tpp)."""
    root = tmp_path_factory.mktemp("evals") / "atlas"
    save_saelens(build_sae(SAEConfig("topk", d_in=32, d_sae=64, k=4, hook_name=HOOK, seed=2)),
                 AtlasLayout(root).sae_dir(SAE))
    return root


@pytest.fixture(scope="module")
def summary_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SAE whose summary holds the planted single-token latents (autointerp)."""
    root = tmp_path_factory.mktemp("autointerp") / "atlas"
    n = len(PLANTED)
    write_sae(root, SAE, np.eye(n, dtype=np.float32), "blocks.0.hook_resid_post")
    occurrence = OccurrenceWriter(root, SAE, n)
    occurrence.append(np.array([0]), np.ones((1, n), dtype=np.int64))
    occurrence.finish()
    write_tables(root, SAE, planted_features(), planted_examples(), {"top_k": 12})
    return root


def _write_points(name: EvalName) -> list[KillPoint]:
    return [KillPoint("pathlib.Path.write_bytes", 1, "mid_write", path_arg=0,  # half the temporary result
                      matching=f"*/evals/.{name}.json.*.tmp"),
            KillPoint("sae_atlas.saes.eval.results.atomic_write_json", 2)]  # result in place, sidecar not written


CASES = [  # (eval, a point while it computes)
    ("meta", KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 10)),  # step 10 of the meta-SAE
    ("absorption", KillPoint("sae_atlas.saes.eval.absorption.letter_absorption", 3)),  # the third letter probed
    ("scr", KillPoint("sae_atlas.saes.eval.scr_tpp.pooled", 1)),
    ("tpp", KillPoint("sae_atlas.saes.eval.scr_tpp.pooled", 1)),
    ("autointerp", KillPoint("sae_atlas.saes.eval.autointerp.latent_examples", 3)),  # the third sampled latent
]


@pytest.fixture(scope="module")
def references(model_atlas: Path, summary_atlas: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The uninterrupted result of each eval (computed on first use) and its work path."""
    work, found = tmp_path_factory.mktemp("work") / "atlas", {}

    def reference(name: EvalName) -> tuple[Path, dict[str, Any]]:
        base = summary_atlas if name == "autointerp" else model_atlas
        if name not in found:
            found[name] = uninterrupted(f"{__name__}.{name}_job", base, work, _timed(name))
        return base, found[name]

    reference.work = work  # type: ignore[attr-defined]
    return reference


@pytest.mark.parametrize(("name", "point"), [pytest.param(name, point, id=f"{name}-computing") for name, point in CASES] + [
    pytest.param(name, point, id=f"{name}-{label}") for name in ("meta", "autointerp")  # one writer: write_result
    for label, point in zip(("mid-result-write", "before-sidecar"), _write_points(name), strict=True)])
def test_an_eval_killed_reruns_to_identical_files(name: EvalName, point: KillPoint, references: Any) -> None:
    base, reference = references(name)
    assert killed_then_resumed(f"{__name__}.{name}_job", base, references.work, point, _timed(name)) == reference
