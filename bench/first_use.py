"""First use of sae-atlas, timed in fresh processes: `sae-atlas --help` start-up, the model
load cold and warm, and the first text search over the CLI, Python and HTTP.

- `--help`: this tree against `--baseline-rev` (extracted with `git archive`; default: the
  commit before the lazy CLI imports), median of `--repeats` runs of `python -m sae_atlas --help`.
- Model load (`saes.models.load_model`, imports excluded): uncached (`SAE_ATLAS_MODEL_CACHE=0`,
  how every load went before the cache), cold (de-quantise and fill an empty cache folder)
  and warm (from that cache).
- First search (needs an atlas of the model, e.g. the demo's): the whole `sae-atlas search
  text` process, the first `Atlas.search_text` in a new Python process, and the first
  `POST /search/text` to a freshly started `sae-atlas serve`; uncached (before) vs warm.

    PYTHONPATH=. python bench/first_use.py [--atlas /work/demo-base] [--model smollm2-135m]
        [--parts help,load,search] [--cache DIR (default: a new temporary folder)]

`search` alone needs `--cache` to name a folder the model is already cached in (the `after`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Monday, Tuesday, Wednesday, Thursday,"
LOAD = """
import json, sys, time
import torch, transformer_lens.model_bridge
from sae_atlas.saes.models import load_model
started = time.perf_counter()
load_model(sys.argv[1])
print(json.dumps({"load_s": time.perf_counter() - started}))
"""
PY_SEARCH = """
import json, sys, time
started = time.perf_counter()
from sae_atlas import Atlas
atlas = Atlas(sys.argv[1])
first = time.perf_counter()
atlas.search_text(sys.argv[2], k=3)
print(json.dumps({"search_s": time.perf_counter() - first, "process_s": time.perf_counter() - started}))
"""


def _env(cache: Path | None) -> dict[str, str]:
    """The environment of a run: the model cache off (None) or in `cache`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    if cache is None:
        env["SAE_ATLAS_MODEL_CACHE"] = "0"
    else:
        env.pop("SAE_ATLAS_MODEL_CACHE", None)
        env["SAE_ATLAS_CACHE_DIR"] = str(cache)
    return env


def _wall(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stdout


def help_times(baseline_rev: str, repeats: int, cache: Path) -> dict[str, float]:
    """Median wall time of `python -m sae_atlas --help` here and at `baseline_rev`."""
    with tempfile.TemporaryDirectory(prefix="first-use-baseline-") as old:
        archive = subprocess.run(["git", "archive", baseline_rev], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        out = {}
        for name, tree in (("before", Path(old)), ("after", ROOT)):
            env = {**_env(cache), "PYTHONPATH": str(tree)}
            out[name] = statistics.median(_wall([sys.executable, "-m", "sae_atlas", "--help"], env, tree)[0]
                                          for _ in range(repeats))
    return out


def load_times(model: str, cache: Path) -> dict[str, float]:
    """load_model seconds in a new process: uncached, cold (fills `cache`), warm."""
    def run(env: dict[str, str]) -> float:
        return json.loads(_wall([sys.executable, "-c", LOAD, model], env)[1].strip().splitlines()[-1])["load_s"]

    return {"uncached": run(_env(None)), "cold": run(_env(cache)), "warm": run(_env(cache))}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _first_http_search(atlas: Path, env: dict[str, str]) -> dict[str, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "sae_atlas", "serve", str(atlas), "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=ROOT)
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
            if server.poll() is not None:
                raise RuntimeError("sae-atlas serve exited")
        up = time.perf_counter()
        answer = httpx.post(url + "/search/text", json={"text": TEXT, "k": 3}, timeout=600)
        answer.raise_for_status()
        return {"search_s": time.perf_counter() - up, "serve_start_s": up - started}
    finally:
        server.terminate()
        server.wait(30)


def search_times(atlas: Path, cache: Path | None) -> dict[str, Any]:
    """The first search over the CLI, Python and HTTP with the cache off (None) or warm."""
    env = _env(cache)
    cli, _ = _wall([sys.executable, "-m", "sae_atlas", "search", "text", str(atlas), TEXT, "-k", "3"], env)
    python = json.loads(_wall([sys.executable, "-c", PY_SEARCH, str(atlas), TEXT], env)[1].strip().splitlines()[-1])
    return {"cli_process_s": cli, "python": python, "http": _first_http_search(atlas, env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atlas", type=Path, default=Path("/work/demo-base"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--baseline-rev", default="f574ffc", help="commit whose --help start-up is 'before'")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="help,load,search", help="comma-separated: help, load, search")
    parser.add_argument("--cache", type=Path, default=None, help="model cache folder (default: a new temporary one)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="first-use-cache-") as tmp:
        cache = args.cache or Path(tmp)
        results: dict[str, Any] = {}
        if "help" in parts:
            results["help"] = help_times(args.baseline_rev, args.repeats, cache)
        if "load" in parts:
            results["load"] = load_times(args.model, cache)
        if "search" in parts:
            results["search_before"] = search_times(args.atlas, None)
            results["search_after"] = search_times(args.atlas, cache)
    if "help" in results:
        h = results["help"]
        print(f"--help start-up: before {h['before']:.2f} s, after {h['after']:.2f} s ({h['before'] / h['after']:.1f}x)")
    if "load" in results:
        load = results["load"]
        print(f"load_model({args.model!r}): uncached {load['uncached']:.2f} s, cold {load['cold']:.2f} s, "
              f"warm {load['warm']:.2f} s ({load['uncached'] / load['warm']:.1f}x faster than uncached)")
    if "search" in parts:
        for when in ("search_before", "search_after"):
            s = results[when]
            print(f"first text search, {when.split('_')[1]}: CLI process {s['cli_process_s']:.2f} s; Python "
                  f"search_text {s['python']['search_s']:.2f} s (process {s['python']['process_s']:.2f} s); "
                  f"HTTP POST /search/text {s['http']['search_s']:.2f} s (serve start {s['http']['serve_start_s']:.2f} s)")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
