"""kill -9 at named points of `compare`, `train-crosscoder`, `latent-scaling`, `compare-circle`,
`emergence` and `steer-bench`; the re-run leaves exactly the files of an uninterrupted run.

Each killed run is a child process that SIGKILLs itself at a monkeypatched call
(`tests.saes.kill_points`; a fresh interpreter, as polars' thread pool does not survive a
fork): while the verb computes (nothing written yet), and where it writes: half-way through
the temporary file of a table or figure (the rename never happens; the re-run removes it),
or after the run's JSON is written but before `runs.json` registers it (the re-run writes
both again). The write points are shared by every verb (`store.analysis_runs.write_analysis`,
`store.atomic.save_png`), so they run once, on `compare` and `compare-circle`; the other
verbs are killed while they compute (kept few: each case runs the verb about twice). Every run of a verb uses one atlas path, so
the paths the runs record agree. Fields that legitimately differ are dropped where named:
a crosscoder's training wall time (`training.json` final_metrics.wall_seconds, repeated in
the run's summary) and so the sha256 of that run's JSON in `runs.json`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
from sae_atlas.api.atlas import Atlas
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.intervene.concepts import weekdays
from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores
from sae_atlas.saes.models import tiny_model
from sae_atlas.store.layout import AtlasLayout
from tests.saes.compare_fixtures import one_thread  # noqa: F401
from tests.saes.kill_points import KillPoint, killed_then_resumed, uninterrupted

MODEL = {"kind": "tiny", "n_layers": 2, "d_model": 32}
HOOK = "blocks.1.hook_resid_post"
CC = "pair"
CC_TIMED = {f"crosscoders/{CC}/training.json": ("final_metrics.wall_seconds",),
            f"analyses/crosscoder/{CC}.json": ("summary.wall_seconds",),
            "analyses/crosscoder/runs.json": (f"runs.{CC}.sha256",)}

MID_TABLE_WRITE = KillPoint("polars.DataFrame.write_parquet", 1, "mid_write")  # half a temporary table
BEFORE_REGISTRATION = KillPoint("sae_atlas.store.analysis_runs._record_run", 1)  # JSON written, runs.json not
MID_FIGURE_WRITE = KillPoint("matplotlib.figure.Figure.savefig", 1, "mid_write")  # half a temporary figure


def _points(*points: KillPoint) -> list[Any]:
    return [pytest.param(p, id=f"{p.target.rsplit('.', 1)[-1]}-{p.call}-{p.when}") for p in points]


class Verb:
    """One verb (`job`: "module.function" of the atlas path) on a fresh copy of `base` at a
    fixed path, its uninterrupted result computed once."""

    def __init__(self, job: str, base: Path, work: Path, timed: dict[str, tuple[str, ...]] | None = None) -> None:
        self.job, self.base, self.work, self.timed = job, base, work, timed or {}
        self.reference = uninterrupted(job, base, work, self.timed)

    def check(self, point: KillPoint) -> None:
        resumed = killed_then_resumed(self.job, self.base, self.work, point, self.timed)
        assert resumed == self.reference


def _two_saes(root: Path) -> tuple[str, str]:
    a, b = AtlasLayout(root).sae_ids()[:2]
    return a, b


# compare ----------------------------------------------------------------------------------

def compare_job(root: Path) -> object:
    return Atlas(root).compare(root, sae="a", other_sae="b", run="a-b", n_tokens=1024, sample_tokens=128,
                               n_perm=5, corpus=CorpusSpec(context_size=32))


@pytest.fixture(scope="module")
def compare_verb(tmp_path_factory: pytest.TempPathFactory) -> Verb:
    from sae_atlas.saes.formats.saelens import save_saelens
    from tests.api.test_compare import _sae

    base = tmp_path_factory.mktemp("compare") / "atlas"
    AtlasLayout(base).update_meta(model=MODEL)
    for sae_id, seed in (("a", 0), ("b", 1)):
        save_saelens(_sae(seed, HOOK), AtlasLayout(base).sae_dir(sae_id))
    return Verb(f"{__name__}.compare_job", base, tmp_path_factory.mktemp("compare-work") / "atlas")


@pytest.mark.parametrize("point", _points(KillPoint("sae_atlas.api.services.compare.compare_codes", 1), MID_TABLE_WRITE,
                                          BEFORE_REGISTRATION))
def test_compare_killed_reruns_to_identical_files(compare_verb: Verb, point: KillPoint) -> None:
    compare_verb.check(point)


# train-crosscoder and latent-scaling -----------------------------------------------------

def crosscoder_job(root: Path) -> object:
    return Atlas(root).train_crosscoder(HOOK, HOOK, model_b=json.dumps({**MODEL, "seed": 1}), d_sae=16, k=2,
                                        n_tokens=1024, batch_size=128, corpus=CorpusSpec(context_size=32),
                                        cc_id=CC, progress=False)


@pytest.fixture(scope="module")
def crosscoder_verb(tmp_path_factory: pytest.TempPathFactory) -> Verb:
    base = tmp_path_factory.mktemp("crosscoder") / "atlas"
    AtlasLayout(base).update_meta(model=MODEL)
    return Verb(f"{__name__}.crosscoder_job", base, tmp_path_factory.mktemp("crosscoder-work") / "atlas", CC_TIMED)


@pytest.mark.parametrize("point", _points(
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 5),  # step 5: after the backward, before Adam
))
def test_train_crosscoder_killed_resumes_to_identical_files(crosscoder_verb: Verb, point: KillPoint) -> None:
    crosscoder_verb.check(point)


def scaling_job(root: Path) -> object:
    return Atlas(root).latent_scaling(CC, tokens=512)


@pytest.fixture(scope="module")
def scaling_verb(crosscoder_verb: Verb, tmp_path_factory: pytest.TempPathFactory) -> Verb:
    base = tmp_path_factory.mktemp("scaling") / "atlas"
    shutil.copytree(crosscoder_verb.base, base, dirs_exist_ok=True)
    crosscoder_job(base)
    timed = {name: keys for name, keys in CC_TIMED.items() if name.startswith("crosscoders/")}
    return Verb(f"{__name__}.scaling_job", base, tmp_path_factory.mktemp("scaling-work") / "atlas", timed)


@pytest.mark.parametrize("point", _points(KillPoint("sae_atlas.saes.compare.latent_scaling.LatentScalingSums.update", 2)))
def test_latent_scaling_killed_reruns_to_identical_files(scaling_verb: Verb, point: KillPoint) -> None:
    scaling_verb.check(point)


# compare-circle and emergence, on a copy of the small atlas ------------------------------

@pytest.fixture(scope="module")
def small_copy(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small atlas with a stored weekday circle run (`circular/weekdays`)."""
    base = tmp_path_factory.mktemp("small") / "atlas"
    shutil.copytree(small_atlas["root"], base)
    handle = Atlas(base).model()
    write_concept_run(base, "weekdays", run_circle_analysis(handle, weekdays(), [0, 1]), model=handle.name)
    return base


def circle_job(root: Path) -> object:
    a, b = _two_saes(root)
    return Atlas(root).compare_circle("circular/weekdays", root, sae=a, other_sae=b, n_null=10, n_random=2,
                                      run="circle")


@pytest.fixture(scope="module")
def circle_verb(small_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Verb:
    return Verb(f"{__name__}.circle_job", small_copy, tmp_path_factory.mktemp("circle-work") / "atlas")


@pytest.mark.parametrize("point", _points(KillPoint("sae_atlas.api.services.circle_transfer.circle_transfer", 1),
                                          MID_FIGURE_WRITE))
def test_compare_circle_killed_reruns_to_identical_files(circle_verb: Verb, point: KillPoint) -> None:
    circle_verb.check(point)


def emergence_job(root: Path) -> object:
    a, b = _two_saes(root)
    return Atlas(root).emergence([f"{root}:{a}", f"{root}:{b}"], ["weekdays", "numbers"], run="series")


@pytest.fixture(scope="module")
def emergence_verb(small_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Verb:
    return Verb(f"{__name__}.emergence_job", small_copy, tmp_path_factory.mktemp("emergence-work") / "atlas")


@pytest.mark.parametrize("point", _points(
    KillPoint("sae_atlas.api.services.emergence.member_scores", 3),  # the second concept's first member
))
def test_emergence_killed_reruns_to_identical_files(emergence_verb: Verb, point: KillPoint) -> None:
    emergence_verb.check(point)


# steer-bench (its --out results and --plot figure written into the atlas folder) ---------

BENCH_OUT, BENCH_PLOT = "bench.json", "bench.png"


def steer_bench_job(root: Path) -> None:
    from sae_atlas.api.cli import app

    sae_id = AtlasLayout(root).sae_ids()[0]
    done = CliRunner().invoke(app, ["steer-bench", str(root), "cat", "--sae", sae_id, "--prompts", "4",
                                    "--candidates", "4", "--ratio", "1.5", "--out", str(root / BENCH_OUT),
                                    "--plot", str(root / BENCH_PLOT)], catch_exceptions=False)
    assert done.exit_code == 0, done.output


@pytest.fixture(scope="module")
def scored(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the small atlas with steering scores for its first SAE."""
    root = tmp_path_factory.mktemp("bench") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    compute_steering_scores(tiny_model(n_layers=2, d_model=32), root, small_atlas["sae_ids"][0],
                            SteeringParams(n_prompts=4, prompt_tokens=8, chunk=64), progress=False)
    return root


@pytest.fixture(scope="module")
def bench_verb(scored: Path, tmp_path_factory: pytest.TempPathFactory) -> Verb:
    return Verb(f"{__name__}.steer_bench_job", scored, tmp_path_factory.mktemp("bench-work") / "atlas")


@pytest.mark.parametrize("point", [  # the results file half-way; the results file written, the plot half-way
    pytest.param(KillPoint("pathlib.Path.write_bytes", 1, "mid_write", path_arg=0, matching=f"*/.{BENCH_OUT}.*.tmp"),
                 id="mid-results-write"),
    pytest.param(KillPoint("matplotlib.figure.Figure.savefig", 1, "mid_write"), id="mid-plot-write"),
])
def test_steer_bench_killed_reruns_to_identical_files(bench_verb: Verb, point: KillPoint) -> None:
    bench_verb.check(point)
