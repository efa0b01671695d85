"""Time of the offline eval suite per SAE and per eval, against a bare forward over the
same tokens, in one run.

    PYTHONPATH=. nice -n 10 python bench/eval_suite.py --atlas /tmp/atlas-demo \
        [--suite core,sparse_probing,absorption,scr,tpp,autointerp,meta,mdl] [--sae ID ...] [--threads 2]

Each (SAE, eval) is one in-process `sae-atlas eval A --sae ID --suite NAME --force`
(the command's own configs and defaults; the lexical-proxy autointerp back-end). The model
is loaded once before the runs (the command reuses the loaded handle) and every forward
the evals make through it is recorded: its tokens and the layer it stopped at.

Baseline: a bare forward (no hooks, every layer) over each recorded token batch, timed once
per distinct token set (the SAEs of one atlas read the same prompts; an eval whose forwards
stop early is thus compared with the full forward over its tokens). Evals that run no model
(meta, mdl, autointerp, and the activation part of core, which reads the cache) have no
baseline of their own; the per-SAE ratio divides the whole suite's time by the bare
forward over every token the suite ran through the model. Both wall seconds and the
process' CPU seconds are reported: on a shared machine the CPU seconds are the figure that
does not depend on what else runs (with `--threads 2`, an idle 2-core machine runs the suite
in about CPU seconds / 2 to CPU seconds of wall time).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.saes.eval.suite import parse_suite
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.store.layout import AtlasLayout

OFFLINE_SUITE = "core,sparse_probing,absorption,scr,tpp,autointerp,meta,mdl"


@dataclass
class Recorder:
    """Wraps a model bridge: every call and `run_with_hooks` is passed on, its tokens kept
    under the current `label`."""

    bridge: Any
    label: str = ""
    batches: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))

    def _keep(self, tokens: Any) -> None:
        if isinstance(tokens, torch.Tensor):
            self.batches[self.label].append(tokens.detach().to("cpu", copy=True))

    def __call__(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        self._keep(tokens)
        return self.bridge(tokens, *args, **kwargs)

    def run_with_hooks(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        self._keep(tokens)
        return self.bridge.run_with_hooks(tokens, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bridge, name)


def digest(batches: list[torch.Tensor]) -> str:
    """One hash of a list of token batches (shapes and ids)."""
    h = hashlib.sha256()
    for tokens in batches:
        h.update(str(tuple(tokens.shape)).encode())
        h.update(tokens.numpy().tobytes())
    return h.hexdigest()


@torch.inference_mode()
def bare_forward(bridge: Any, batches: list[torch.Tensor]) -> None:
    """A hook-free full forward over every batch."""
    for tokens in batches:
        bridge(tokens)


class Seconds(NamedTuple):
    """Wall and process CPU seconds of one timed step."""

    wall: float
    cpu: float


def timed(step: Callable[[], object]) -> Seconds:
    """Wall and CPU seconds of `step()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return Seconds(time.perf_counter() - wall, time.process_time() - cpu)


def run_eval(atlas: str, sae_id: str, name: str) -> None:
    """One `sae-atlas eval --suite NAME --force` on one SAE (SystemExit on failure)."""
    result = CliRunner().invoke(app, ["eval", atlas, "--sae", sae_id, "--suite", name, "--force",
                                      "--device", "cpu"])
    if result.exit_code != 0:
        raise SystemExit(f"{name} on {sae_id} failed:\n{result.output}\n{result.exception!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atlas", default="/tmp/atlas-demo")
    parser.add_argument("--suite", default=OFFLINE_SUITE)
    parser.add_argument("--sae", action="append", default=[], help="SAE id (repeatable); default: all")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = parse_suite(args.suite)
    layout = AtlasLayout(args.atlas)
    sae_ids = args.sae or layout.sae_ids()
    handle: ModelHandle = load_model(layout.read_meta()["model"], device="cpu")
    recorder = Recorder(handle.bridge)
    handle.bridge = recorder
    bare_by_digest: dict[str, Seconds] = {}
    for sae_id in sae_ids:  # each SAE's table as soon as it is done
        seconds: dict[str, Seconds] = {}
        for name in names:
            recorder.label = f"{sae_id}|{name}"
            seconds[name] = timed(lambda: run_eval(args.atlas, sae_id, name))  # noqa: B023 (called at once)
            tokens = sum(t.numel() for t in recorder.batches[recorder.label])
            print(f"{sae_id} {name}: {seconds[name].wall:.1f} s wall, {seconds[name].cpu:.1f} s CPU, {tokens} tokens "
                  f"forwarded (load {os.getloadavg()[0]:.1f})", flush=True)
        bare: dict[str, Seconds] = {}
        handle.bridge = recorder.bridge
        for name in names:
            batches = recorder.batches.get(f"{sae_id}|{name}", [])
            key = digest(batches)
            if key not in bare_by_digest:
                bare_by_digest[key] = timed(lambda: bare_forward(handle.bridge, batches))  # noqa: B023
            bare[name] = bare_by_digest[key]
        handle.bridge = recorder
        print(f"\n{sae_id}\n{'eval':15s} {'tokens':>9s} {'wall s':>8s} {'CPU s':>8s} {'bare wall':>9s} "
              f"{'bare CPU':>9s} {'CPU ratio':>9s}")
        for name in names:
            tokens = sum(t.numel() for t in recorder.batches.get(f"{sae_id}|{name}", []))
            run, base = seconds[name], bare[name]
            ratio = f"{run.cpu / base.cpu:9.2f}" if base.cpu > 0.01 else "        -"
            print(f"{name:15s} {tokens:9d} {run.wall:8.1f} {run.cpu:8.1f} {base.wall:9.1f} {base.cpu:9.1f} {ratio}")
        run = Seconds(*(sum(seconds[n][i] for n in names) for i in (0, 1)))
        base = Seconds(*(sum(bare[n][i] for n in names) for i in (0, 1)))
        print(f"{'whole suite':15s} {'':9s} {run.wall:8.1f} {run.cpu:8.1f} {base.wall:9.1f} {base.cpu:9.1f} "
              f"{run.cpu / max(base.cpu, 1e-9):9.2f}  ({run.wall / 60:.1f} min wall, {run.cpu / 60:.1f} min CPU)\n",
              flush=True)

if __name__ == "__main__":
    main()
