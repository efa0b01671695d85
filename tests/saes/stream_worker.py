"""torchrun worker for test_summary_stream: `python -m torch.distributed.run --standalone
--nproc_per_node=2 -m tests.saes.stream_worker ATLAS` summarizes the atlas's SAEs from the
model with the ranks splitting the batches."""

from __future__ import annotations

import sys

from sae_atlas.saes.distributed import init_distributed
from sae_atlas.saes.summary.stream import summarize_from_model
from tests.saes.stream_fixture import BATCH_BLOCKS, CORPUS, N_TOKENS, tiny


def main() -> None:
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    summarize_from_model(tiny(), sys.argv[1], corpus=CORPUS, n_tokens=N_TOKENS, batch_blocks=BATCH_BLOCKS,
                         checkpoint_every=2, progress=False, ctx=ctx)


if __name__ == "__main__":
    main()
