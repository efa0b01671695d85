"""torchrun worker for test_depth_stream: `python -m torch.distributed.run --standalone
--nproc_per_node=2 -m tests.saes.depth_dist_worker OUT.npz` streams the depth statistics
with the ranks splitting the batches; rank 0 saves what they merged to."""

from __future__ import annotations

import sys

import numpy as np

from sae_atlas.saes.distributed import init_distributed
from tests.saes.test_depth_stream import dist_stream


def main() -> None:
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    s = dist_stream(ctx)
    if ctx.is_main:
        lens_n = sum(s.lens.n.values())
        np.savez(sys.argv[1], states=s.states, block=s.block, position=s.position, cka=s.cka.result(),
                 n_tokens=s.n_tokens, lens_n=lens_n, fit_n=s.tuned.n_fit)


if __name__ == "__main__":
    main()
