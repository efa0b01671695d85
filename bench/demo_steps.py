"""Seconds of the demo's explorer steps on an atlas the demo's first steps built (use a
copy: the steps write into it): the suite's `core` eval, the steering screen, the stored
graph and the comparison, each after the model is loaded once.

    cp -r atlas-demo /tmp/atlas-steps
    PYTHONPATH=. python bench/demo_steps.py --atlas /tmp/atlas-steps

A step whose result the atlas already holds is kept by the demo; this reports it as kept.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.commands.demo import show
from sae_atlas.api.services import demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--atlas", type=Path, required=True)
    args = parser.parse_args()
    ctx = Atlas(args.atlas).ctx
    started = time.perf_counter()
    handle = ctx.model()
    print(f"model load: {time.perf_counter() - started:.1f} s", flush=True)
    sae_ids = sorted(ctx.sae_ids(), key=lambda sae_id: int(sae_id.split(".")[1]))  # by layer, as the demo has them
    steps = [("core eval (suite)", lambda: demo.core_evals(ctx, sae_ids, None, show)),
             ("steering screen", lambda: demo.steering_tables(ctx, handle, sae_ids, show)),
             ("stored graph", lambda: demo.stored_graph(ctx, *demo.DEMO_GRAPH, show)),
             ("comparison", lambda: demo.comparison(ctx, sae_ids, str(handle.device), show))]
    times = {}
    for name, step in steps:
        started = time.perf_counter()
        step()
        times[name] = time.perf_counter() - started
    for name, seconds in times.items():
        print(f"{name}: {seconds:.1f} s")
    print(f"explorer steps in all: {sum(list(times.values())[1:]):.1f} s")


if __name__ == "__main__":
    main()
