"""torchrun worker for the kill -9 tests: `python -m torch.distributed.run --standalone
--nproc_per_node=R -m tests.saes.kill_worker POINT ARGS...` runs `sae-atlas ARGS` as the
real command does, except that every rank SIGKILLs itself at the named point `POINT` (a
`KillPoint` as JSON), as a power cut of the whole job at that point."""

from __future__ import annotations

import json
import sys

from sae_atlas.api.cli import app
from tests.saes.kill_points import KillPoint


def main() -> None:
    KillPoint(**json.loads(sys.argv[1])).install()
    app(sys.argv[2:])


if __name__ == "__main__":
    main()
