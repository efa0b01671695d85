"""torchrun worker for test_cache_distributed: `python -m torch.distributed.run --standalone
--nproc_per_node=2 -m tests.saes.cache_worker N cache ARGS...` runs `sae-atlas cache ARGS`
as the real command does, except that rank 1 kills itself with SIGKILL just before its
N-th forward pass (a rank lost mid-run, with no chance to clean up)."""

from __future__ import annotations

import os
import signal
import sys

import sae_atlas.saes.streaming as streaming
from sae_atlas.api.cli import app


def main() -> None:
    kill_at, args = int(sys.argv[1]), sys.argv[2:]
    if os.environ.get("RANK") == "1":
        real, calls = streaming.run_hooks, [0]

        def dies_at_call(*a: object, **kw: object) -> object:
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **kw)

        streaming.run_hooks = dies_at_call
    app(args)


if __name__ == "__main__":
    main()
