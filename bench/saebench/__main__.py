"""Cross-check our core and sparse-probing evals against SAEBench itself, offline.

One command, from the repository root:

    .venv/bin/python -m bench.saebench [--venv /tmp/saebench-venv] [--reuse-inputs]

1. `bench.saebench.inputs` writes the shared inputs to `tests/fixtures/saebench/` (a
   tiny GPT-NeoX folder, a TopK SAE in SAELens format, core token blocks, labelled texts);
   `--reuse-inputs` keeps the ones there.
2. A throwaway venv for SAEBench is created when missing (SAELens pins TransformerLens 3,
   which cannot share our environment): `pip install torch==2.13.0` first (the CPU build
   on this disk; a bare torch requirement pulls CUDA wheels), then `sae-bench==0.6.0` with
   `jaxtyping==0.3.3 beartype==0.14.1` (SAEBench's tested versions: newer jaxtyping
   rejects its sparse-probing shape annotations) and `torchvision==0.28.0`, which is
   uninstalled again: SAEBench declares torchvision, a newer one would replace torch with
   a CUDA build, 0.28.0's operators do not load against the CPU torch (transformers then
   fails to import), and the core and sparse-probing evals never use it.
3. `bench/saebench/run_saebench.py` runs SAEBench's core and sparse-probing evals in that
   venv and writes their output JSONs (and the pooled vectors its probes read) beside the
   inputs.
4. `bench.saebench.ours` computes our metrics on the same inputs and prints every
   metric side by side with its tolerance (`tests/saes/test_saebench_crosscheck.py`
   repeats step 4 in CI on the committed fixture).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.saebench import inputs, ours

# torchvision 0.28.0 keeps torch at 2.13 while SAEBench installs (then it is removed).
SAEBENCH_PACKAGES = ("sae-bench==0.6.0", "torchvision==0.28.0", "jaxtyping==0.3.3", "beartype==0.14.1")


def ensure_venv(venv: Path) -> Path:
    """The venv's python, after creating the venv and installing SAEBench when missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SAEBENCH_PACKAGES], check=True)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/saebench-venv"))
    parser.add_argument("--fixture", type=Path, default=inputs.FIXTURE)
    parser.add_argument("--reuse-inputs", action="store_true")
    args = parser.parse_args()
    if not args.reuse_inputs:
        inputs.build(args.fixture)
    python = ensure_venv(args.venv)
    script = Path(__file__).with_name("run_saebench.py")
    # SAEBench records `git rev-parse HEAD` of its working directory as its own commit;
    # outside any repository it records "Unknown" instead of this project's commit.
    with tempfile.TemporaryDirectory() as outside:
        subprocess.run([str(python), str(script), str(args.fixture.resolve())], check=True, cwd=outside)
    checks = ours.main(args.fixture)
    sys.exit(0 if all(c.ok for c in checks) else 1)


if __name__ == "__main__":
    main()
