"""torchrun worker for test_train_stream_distributed: `python -m torch.distributed.run --standalone
--nproc_per_node=2 -m tests.saes.train_stream_worker ATLAS data|modules` trains the test's two
SAEs from the model's stream, each rank streaming its own lane."""

from __future__ import annotations

import sys

from sae_atlas.saes.distributed import init_distributed
from tests.saes.test_train_stream_distributed import run


def main() -> None:
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    run(sys.argv[1], sys.argv[2], lanes=None)


if __name__ == "__main__":
    main()
