"""The eval layer of `suite`; its other layers: `sae_atlas.api.results.suite` (typed-result).

The evaluation suite: every registered eval, run resumably over SAEs of an atlas.

`EVALS` is the registry (one module per eval under `saes.eval`, each declaring its
`EvalSpec`). `run_suite` runs the named evals on each SAE in turn with a progress bar per
(SAE, eval): a result that verifies and was computed with the same config from the same
weights is kept (so a killed run restarts the rest), a failing eval is reported and leaves
any earlier result untouched (results are written only after an eval succeeds, atomically,
sidecar last), and every other eval still runs. Under torchrun the ranks take the (SAE, eval) jobs in
turn, each writing its own results, and every rank ends with the merged `SuiteRun`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
from tqdm.auto import tqdm

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext, rank_and_world
from sae_atlas.saes.eval.absorption import ABSORPTION
from sae_atlas.saes.eval.autointerp import AUTOINTERP
from sae_atlas.saes.eval.core import CORE
from sae_atlas.saes.eval.ground_truth import GROUND_TRUTH
from sae_atlas.saes.eval.mdl import MDL
from sae_atlas.saes.eval.meta import META
from sae_atlas.saes.eval.results import finished_result, write_result
from sae_atlas.saes.eval.scr_tpp import SCR, TPP
from sae_atlas.saes.eval.sparse_probing import SPARSE_PROBING
from sae_atlas.saes.eval.spec import EVAL_NAMES, EvalInputs, EvalName, EvalSpec
from sae_atlas.saes.models import ModelHandle

EVALS: dict[EvalName, EvalSpec[Any]] = {spec.name: spec for spec in (CORE, SPARSE_PROBING, META, MDL, GROUND_TRUTH,
                                                                    ABSORPTION, AUTOINTERP, SCR, TPP)}


def parse_suite(text: str) -> list[EvalName]:
    """Eval names from a comma-separated list, in order, without repeats (InvalidInputError
    naming an unknown one and listing the valid names)."""
    names: list[EvalName] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in EVALS:
            raise InvalidInputError(f"unknown eval {name!r} in --suite; valid: {', '.join(EVAL_NAMES)}")
        if name not in names:
            names.append(name)  # type: ignore[arg-type]
    return names


@dataclass
class SuiteRun:
    """What a suite run produced: per SAE the result of each eval that has one (kept or
    new), which were kept from earlier runs, and the failures with their messages."""

    results: dict[str, dict[EvalName, dict[str, Any]]] = field(default_factory=dict)
    kept: list[tuple[str, EvalName]] = field(default_factory=list)
    failures: dict[tuple[str, EvalName], str] = field(default_factory=dict)


def run_suite(atlas: str | Path, sae_ids: Sequence[str], names: Sequence[EvalName], configs: dict[EvalName, Any],
              *, device: str, model: Callable[[], ModelHandle], force: bool = False,
              progress: bool = True, ctx: DistContext | None = None) -> SuiteRun:
    """Run `names` on every SAE of `sae_ids` with `configs` (an eval without one uses its
    config's defaults); `force` recomputes finished results. Under torchrun (`ctx`) rank r
    runs jobs r, r + R, ... of the (SAE, eval) list and the ranks' runs are merged. The
    progress bar shows on a terminal only (rank 0's)."""
    jobs = rank_jobs(sae_ids, names, ctx)
    rank, world = rank_and_world(ctx)
    run = SuiteRun(results={sae_id: {} for sae_id in sae_ids})
    bar = tqdm(total=len(jobs), disable=None if progress and rank == 0 else True, unit="eval")  # None: off without a TTY
    inputs: EvalInputs | None = None  # one SAE loaded at a time: the jobs run SAE by SAE
    for sae_id, name in jobs:
        if inputs is None or inputs.sae_id != sae_id:
            inputs = EvalInputs(Path(atlas), sae_id, device, model)
        spec = EVALS[name]
        config = configs.get(name) or spec.config_type()
        bar.set_description(f"{sae_id} {name}")
        kept = None if force else finished_result(atlas, sae_id, spec, config)
        if kept is not None:
            run.results[sae_id][name] = kept
            run.kept.append((sae_id, name))
        else:
            started = time.perf_counter()
            try:
                outcome = spec.run(inputs, config)
            except Exception as exc:  # reported per eval; the other evals still run
                run.failures[(sae_id, name)] = f"{type(exc).__name__}: {exc}"
            else:
                run.results[sae_id][name] = write_result(atlas, sae_id, spec, config, outcome,
                                                         time.perf_counter() - started)
        bar.update(1)
    bar.close()
    return run if world == 1 else _merged(run, sae_ids, names, world)


def rank_jobs(sae_ids: Sequence[str], names: Sequence[EvalName],
              ctx: DistContext | None) -> list[tuple[str, EvalName]]:
    """This rank's (SAE, eval) jobs: jobs r, r + R, ... of the SAE-major list (all of them
    in one process)."""
    rank, world = rank_and_world(ctx)
    return [(sae_id, name) for sae_id in sae_ids for name in names][rank::world]


def _merged(own: SuiteRun, sae_ids: Sequence[str], names: Sequence[EvalName], world: int) -> SuiteRun:
    """Every rank's `SuiteRun` gathered into one, results in (SAE, eval) order."""
    parts: list[SuiteRun | None] = [None] * world
    dist.all_gather_object(parts, own)
    merged = SuiteRun(results={sae_id: {} for sae_id in sae_ids})
    for part in parts:
        assert part is not None
        merged.kept += part.kept
        merged.failures.update(part.failures)
    for sae_id in sae_ids:
        for name in names:
            for part in parts:
                assert part is not None
                if name in part.results.get(sae_id, {}):
                    merged.results[sae_id][name] = part.results[sae_id][name]
    return merged
