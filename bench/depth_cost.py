"""Cost of the depth analysis against a bare full forward, in one process.

Baseline: the model's plain forward (no hooks) over the same corpus blocks. Then one depth
stream (`saes.depth.capture.stream_depth`, every layer's residual captured) whose parts are
timed by wrapping them: the CKA sums (`CKAAccumulator.update`), the tuned lens's sums and
fit, and the lens scores (`score_lenses`), and inside what is left: the capturing forward
(`run_hooks`, every layer's residual kept), the CKA rows and token subsample (`_gather`, less
its CKA sums) and the lens rows (`next_token_rows`); the rest is the loop itself (batching,
tokenizing, the excluded positions). Then the estimators on the subsample: TwoNN, MLE with bootstrap and local
ID per layer, and the trajectories. Printed: seconds, tokens/s and ratio to the bare
forward of

- ID/LID/trajectories: capturing forward + subsample + those estimators (the 0.5x target);
- the same with the CKA sums; the full analysis (all parts).

With `--lens-tokens N` the lens scores run on only the first held-out batches covering N
tokens (they cost far more than the rest: two unembeddings per layer per token), and their
rate is reported per token they scored; the full total then adds their time scaled to every
held-out token, marked as extrapolated. Also printed: the bytes the CKA sums hold (fixed by
the layers and widths, not the token count) and the process's peak RSS.

    nice -n 10 .venv/bin/python bench/depth_cost.py --model smollm2-135m --tokens 16384 --lens-tokens 2048
    nice -n 10 .venv/bin/python bench/depth_cost.py --model '{"kind": "tiny", "n_layers": 6}' --tokens 4096
"""

from __future__ import annotations

import argparse
import resource
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from sae_atlas.geometry.cka import CKAAccumulator
from sae_atlas.geometry.intrinsic_dimension import local_dimension, mle_dimension, twonn_dimension
from sae_atlas.geometry.trajectories import trajectory_geometry
from sae_atlas.saes import streaming
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.depth import capture as stream_module
from sae_atlas.saes.depth.lens import TunedLens, TunedLensFitter
from sae_atlas.saes.models import load_model, normalize_spec
from sae_atlas.saes.streaming import whole_blocks

SPENT: dict[str, float] = defaultdict(float)
SCORED = [0]


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--lens-tokens", type=int, default=0, help="score lenses on this many tokens only (0: all)")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--max-points", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--id-only", action="store_true", help="make the CKA sums and the lenses no-ops: only the "
                        "capture, the subsample and the estimators run (the ID/LID/trajectories path)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    handle = load_model(normalize_spec(args.model), device=args.device)
    corpus = CorpusSpec(context_size=args.context)
    n_blocks = whole_blocks(args.tokens, corpus)
    tokens = n_blocks * args.context

    start = time.perf_counter()
    with torch.inference_mode():
        for batch in iter_blocks(handle.tokenizer, corpus, max_blocks=n_blocks, batch_blocks=args.batch_blocks):
            handle.bridge(batch.token_ids.to(handle.device))
    bare = time.perf_counter() - start

    real_score = stream_module.score_lenses
    if args.id_only:
        CKAAccumulator.update = lambda self, rows: None  # type: ignore[method-assign]
        TunedLensFitter.update = lambda self, states, final: None  # type: ignore[method-assign]
        TunedLensFitter.fit = lambda self, ridge=0.0: TunedLens({}, {}, 0, ridge)  # type: ignore[method-assign]
        real_score = lambda *args: None  # noqa: E731

    def score(handle: Any, rows: dict[int, torch.Tensor], next_ids: torch.Tensor, *rest: Any) -> None:
        n = len(next_ids)
        if args.lens_tokens and SCORED[0] >= args.lens_tokens:
            SPENT["lens rows skipped"] += n
            return
        SCORED[0] += n
        real_score(handle, rows, next_ids, *rest)

    stream_module.score_lenses = timed("lens scores", score)
    streaming.run_hooks = timed("capturing forward", streaming.run_hooks)  # type: ignore[attr-defined]
    stream_module._gather = timed("gather", stream_module._gather)  # type: ignore[attr-defined]
    stream_module.next_token_rows = timed("lens rows", stream_module.next_token_rows)
    CKAAccumulator.update = timed("CKA sums", CKAAccumulator.update)  # type: ignore[method-assign]
    TunedLensFitter.update = timed("tuned-lens sums", TunedLensFitter.update)  # type: ignore[method-assign]
    TunedLensFitter.fit = timed("tuned-lens fit", TunedLensFitter.fit)  # type: ignore[method-assign]
    start = time.perf_counter()
    s = stream_module.stream_depth(handle, corpus, list(range(handle.n_layers)), n_tokens=args.tokens,
                                   batch_blocks=args.batch_blocks, max_points=args.max_points, progress=False)
    streamed = time.perf_counter() - start
    inside = ("capturing forward", "gather", "lens rows")  # parts of the capture (gather includes the CKA sums)
    parts = {k: v for k, v in SPENT.items() if k != "lens rows skipped" and k not in inside}
    capture = streamed - sum(parts.values())
    subsample = SPENT["gather"] - SPENT["CKA sums"]

    start = time.perf_counter()
    for i in range(len(s.layers)):
        X = s.states[:, i]
        twonn_dimension(X), mle_dimension(X, k=10, n_boot=200), local_dimension(X, k=20)
    trajectory_geometry(s.states)
    estimators = time.perf_counter() - start
    start = time.perf_counter()
    if not args.id_only:
        s.cka.result()
    cka_result = time.perf_counter() - start

    held_out = SCORED[0] + int(SPENT.get("lens rows skipped", 0))
    lens_full = parts.get("lens scores", 0.0) * held_out / max(SCORED[0], 1)
    cka_bytes = sum(a.nbytes for a in [*s.cka._sum, *s.cka._cross.values(), *s.cka._a.values()])
    print(f"model {handle.name}, {handle.n_layers} layers, d_model {handle.d_model}, {tokens} tokens, device "
          f"{args.device}, {args.threads} threads, subsample {len(s.states)}; " +
          ("CKA sums and lenses skipped" if args.id_only else f"lens scores on {SCORED[0]} of {held_out} held-out "
                                                               "tokens"))
    rows = [("bare forward", bare, tokens),
            ("capture + subsample", capture, tokens),
            ("... capturing forward", SPENT["capturing forward"], tokens),
            ("... CKA rows + subsample", subsample, tokens),
            ("... lens rows", SPENT["lens rows"], tokens),
            ("... loop", capture - SPENT["capturing forward"] - subsample - SPENT["lens rows"], tokens),
            ("estimators", estimators, tokens),
            ("CKA sums + result", parts.get("CKA sums", 0.0) + cka_result, tokens),
            ("tuned-lens sums + fit", parts.get("tuned-lens sums", 0.0) + parts.get("tuned-lens fit", 0.0), tokens),
            ("lens scores", parts.get("lens scores", 0.0), SCORED[0]),
            ("ID/LID/trajectories", capture + estimators, tokens),
            ("... less the lens rows", capture - SPENT["lens rows"] + estimators, tokens),
            ("... + CKA", capture + estimators + parts.get("CKA sums", 0.0) + cka_result, tokens),
            ("full analysis" + (" (lens extrapolated)" if args.lens_tokens else ""),
             capture + estimators + cka_result + sum(v for k, v in parts.items() if k != "lens scores") + lens_full,
             tokens)]
    bare_rate = tokens / bare
    if args.id_only:
        skipped = ("CKA sums + result", "tuned-lens sums + fit", "lens scores", "... + CKA")
        rows = [row for row in rows if row[0] not in skipped and not row[0].startswith("full analysis")]
    for name, seconds, n in rows:
        rate = n / seconds if seconds > 0 else float("inf")
        print(f"{name:>36}: {seconds:8.2f} s  {rate:9.0f} tok/s  ratio to bare {rate / bare_rate:6.3f}x")
    print(f"CKA sums held: {cka_bytes / 2**30:.2f} GiB ({len(s.layers)} layers, fixed by layers and widths); "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
