"""An atlas of many large SAEs (default 8 x 16,384 latents on SmolLM2-135M): build it with
the project's commands, then time searches and feature pages on it, in process and over HTTP.

    PYTHONPATH=. python bench/atlas_scale.py build --atlas DIR [--layers 1,2,3,4,5,6,7,8]
        [--d-sae 16384] [--k 32] [--cache-tokens 65536] [--train-tokens 32768]
        [--summary-tokens 16384] [--corpus builtin] [--no-logits]
    PYTHONPATH=. python bench/atlas_scale.py measure --atlas DIR [--atlas DIR2 ...]
        [--queries 200] [--seconds 5] [--clients 1,32] [--workers 1,2]

`build` runs, as subprocesses, `sae-atlas cache` (the hooks `blocks.L.hook_resid_post`),
`train` (TopK, every cached hook, a short budget: search cost does not depend on how well
the SAEs are trained), `summarize --from-model` (with `--no-logits`: `--no-model`, no logit
effects, which cost a vocabulary-sized product per latent) and `index`, and prints each
step's wall time and peak RSS; a step already done is kept (each command resumes). `measure` takes each atlas in turn (list the baseline atlas first, e.g. a
3 x 4608 one built by the same command, so both are measured under the same load): in a
fresh child process it times `Atlas.preload` and then, over `--queries` random latents,
the facade calls a feature page and a search make (feature page, similar k=10, flow k=5,
nearest to a random direction in one SAE and across all), p50 / p99; then it starts `sae-atlas
serve` and runs the HTTP load of `bench/api_load.py` (closed-loop keep-alive clients) for
each clients x workers pair, with the server's resident memory (all its processes) after
the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import api_load  # noqa: E402


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def run_step(name: str, args: list[str]) -> dict[str, Any]:
    """Run `python -m sae_atlas ARGS`; wall seconds and the process' peak RSS."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sae_atlas", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{name} failed: sae-atlas {' '.join(args)}")
    result = {"step": name, "seconds": time.perf_counter() - started, "peak_rss_mb": usage.ru_maxrss / 1024}
    print(f"{name:<10} {result['seconds']:8.1f} s   peak RSS {result['peak_rss_mb']:6.0f} MB   "
          f"sae-atlas {' '.join(args)}", flush=True)
    return result


def build(args: argparse.Namespace) -> None:
    atlas = str(args.atlas)
    hooks = [arg for layer in args.layers for arg in ("--hook", f"blocks.{layer}.hook_resid_post")]
    corpus = ["--corpus", args.corpus]
    run_step("cache", ["cache", "--atlas", atlas, "--model", args.model, *hooks, *corpus,
                       "--tokens", str(args.cache_tokens), "--device", "cpu"])
    run_step("train", ["train", "--atlas", atlas, "--arch", "topk", "--d-sae", str(args.d_sae), "--k", str(args.k),
                       "--tokens", str(args.train_tokens)])
    run_step("summarize", ["summarize", "--atlas", atlas, "--from-model", *corpus, "--tokens",
                           str(args.summary_tokens), "--device", "cpu", *(["--no-model"] if args.no_logits else [])])
    run_step("index", ["index", "--atlas", atlas])


def percentiles(ms: list[float]) -> str:
    return f"{np.percentile(ms, 50):.2f} / {np.percentile(ms, 99):.2f}"


def timed(call: Any, picks: list[Any]) -> list[float]:
    call(picks[0])  # warm-up
    out = []
    for pick in picks:
        started = time.perf_counter()
        call(pick)
        out.append((time.perf_counter() - started) * 1000)
    return out


def in_process(root: Path, queries: int) -> dict[str, Any]:
    """Preload time / memory and facade latencies (ms, p50 / p99) on one atlas."""
    from sae_atlas import Atlas
    from sae_atlas.api.http.json_body import dumps

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    atlas = Atlas(root)
    started = time.perf_counter()
    atlas.preload()
    preload_s = time.perf_counter() - started
    ids = atlas.sae_ids
    widths = {s: int(atlas.sae_info(s)["d_sae"]) for s in ids}
    d_in = int(atlas.sae_info(ids[0])["d_in"])
    rng = random.Random(0)
    picks = [(rng.choice(ids), 0) for _ in range(queries)]
    picks = [(s, rng.randrange(widths[s])) for s, _ in picks]
    vectors = np.random.default_rng(0).standard_normal((queries, d_in)).astype(np.float32)
    pairs = list(zip(picks, vectors, strict=True))
    calls = {
        "feature page": lambda p: dumps(atlas.feature(*p[0])),
        "similar k=10": lambda p: atlas.similar(*p[0], k=10),
        "flow k=5": lambda p: atlas.flow(*p[0], k=5),
        "vector, one SAE, k=10": lambda p: atlas.search_vector(p[1], sae_id=p[0][0], k=10),
        "vector, all SAEs, k=10": lambda p: atlas.search_vector(p[1], k=10),
    }
    latencies = {name: percentiles(timed(call, pairs)) for name, call in calls.items()}
    return {"saes": len(ids), "latents": sum(widths.values()), "preload_s": preload_s,
            "rss_before_mb": rss_start, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "latencies": latencies}


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (MB)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0) / 1024
    return total


def http_requests(root: Path) -> dict[str, Any]:
    """name -> request(rng) -> (method, target, body): the feature page and the searches."""
    from sae_atlas import Atlas

    atlas = Atlas(root)
    ids = atlas.sae_ids
    widths = {s: int(atlas.sae_info(s)["d_sae"]) for s in ids}
    d_in = int(atlas.sae_info(ids[0])["d_in"])

    def pick(rng: random.Random) -> str:
        sae = rng.choice(ids)
        return f"/saes/{sae}/features/{rng.randrange(widths[sae])}"

    def vector(rng: random.Random) -> tuple[str, str, bytes]:
        body = {"vector": [rng.gauss(0.0, 1.0) for _ in range(d_in)], "k": 10}
        return "POST", "/search/vector", orjson.dumps(body)

    return {
        "feature page": lambda rng: ("GET", pick(rng), b""),
        "similar k=10": lambda rng: ("GET", pick(rng) + "/similar?k=10", b""),
        "flow k=5": lambda rng: ("GET", pick(rng) + "/flow?k=5", b""),
        "vector, all SAEs, k=10": vector,
    }


def over_http(root: Path, clients: list[int], workers: list[int], seconds: float) -> None:
    requests = http_requests(root)
    for n_workers in workers:
        proc, url = api_load.start_server(root, n_workers)
        try:
            print(f"  HTTP, {n_workers} worker(s): server RSS {tree_rss_mb(proc.pid):.0f} MB after preload", flush=True)
            for n_clients in clients:
                for name, make in requests.items():
                    api_load.run(api_load.load(url, make, min(8, n_clients), 1.0))  # warm-up
                    r = api_load.run(api_load.load(url, make, n_clients, seconds))
                    print(f"  | {n_workers} | {n_clients} | {name} | {r['requests']} | {r['errors']} | {r['p50']:.1f} | "
                          f"{r['p99']:.1f} | {r['rps']:.0f} |", flush=True)
            print(f"  server RSS {tree_rss_mb(proc.pid):.0f} MB after the load", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def measure(args: argparse.Namespace) -> None:
    for root in args.atlas:
        out = subprocess.run([sys.executable, __file__, "facade", "--atlas", str(root), "--queries", str(args.queries)],
                             cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"facade timing failed on {root}:\n{out.stderr[-4000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{root}: {r['saes']} SAEs, {r['latents']} latents; preload {r['preload_s']:.1f} s, "
              f"process RSS {r['rss_mb']:.0f} MB after it ({r['rss_before_mb']:.0f} MB before)")
        print("  in process (Atlas facade), ms p50 / p99: "
              + "; ".join(f"{name} {value}" for name, value in r["latencies"].items()), flush=True)
        if args.clients:
            print("  | workers | clients | request | requests | errors | p50 ms | p99 ms | req/s |")
            over_http(root, args.clients, args.workers, args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="cache, train, summarize and index an atlas")
    b.add_argument("--atlas", type=Path, required=True)
    b.add_argument("--model", default="smollm2-135m")
    b.add_argument("--layers", type=int_list, default=list(range(1, 9)))
    b.add_argument("--d-sae", type=int, default=16384)
    b.add_argument("--k", type=int, default=32)
    b.add_argument("--cache-tokens", type=int, default=65536)
    b.add_argument("--train-tokens", type=int, default=32768)
    b.add_argument("--summary-tokens", type=int, default=16384)
    b.add_argument("--corpus", default="builtin")
    b.add_argument("--no-logits", action="store_true", help="summaries without logit effects")
    m = commands.add_parser("measure", help="facade and HTTP latencies on atlases")
    m.add_argument("--atlas", type=Path, action="append", required=True)
    m.add_argument("--queries", type=int, default=200)
    m.add_argument("--seconds", type=float, default=5.0)
    m.add_argument("--clients", type=int_list, default=[1, 32])
    m.add_argument("--workers", type=int_list, default=[1, 2])
    f = commands.add_parser("facade", help=argparse.SUPPRESS)
    f.add_argument("--atlas", type=Path, required=True)
    f.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    if args.command == "build":
        build(args)
    elif args.command == "measure":
        measure(args)
    else:
        print(json.dumps(in_process(args.atlas, args.queries)))


if __name__ == "__main__":
    main()
