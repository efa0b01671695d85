"""Cost of streamed SAE matching against a bare forward of both models, in one run.

Baseline: the paired forward alone (`saes.compare.pairs.paired_activations`: the corpus
packed into blocks, each batch run through model A, and model B when the SAEs read two
models; one forward captures both hooks of one model). Measured: the same stream with both
SAEs encoding every token and the correlation sums of every latent pair plus the rotation
null's (`saes.compare.saes_pair.stream_statistics`). Prints tokens/s of each and the ratio.

    nice -n 10 .venv/bin/python bench/compare_stream.py /tmp/runs/compare/seed0 /tmp/runs/compare/seed1 \\
        --tokens 8192 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from sae_atlas.api.services.compare import open_side
from sae_atlas.saes.atlas_saes import hook_of
from sae_atlas.saes.compare.pairs import Side, paired_activations
from sae_atlas.saes.compare.saes_pair import CompareParams, stream_statistics
from sae_atlas.saes.corpus import CorpusSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side_a", help="ATLAS[:SAE]")
    parser.add_argument("side_b", help="ATLAS[:SAE]")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-blocks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    view_a = open_side(args.side_a)
    view_b = open_side(args.side_b, near=view_a.ctx)
    id_a, id_b = view_a.sae_id, view_b.sae_id
    sae_a, sae_b = view_a.module(args.device), view_b.module(args.device)
    handles = [view.ctx.model(args.device) for view in (view_a, view_b)]
    a, b = Side(handles[0], hook_of(sae_a, id_a)), Side(handles[1], hook_of(sae_b, id_b))
    corpus = CorpusSpec(context_size=args.context)
    params = CompareParams(n_tokens=args.tokens, batch_blocks=args.batch_blocks, sample_tokens=256)

    def pairs():
        return paired_activations(a, b, corpus, n_tokens=args.tokens, batch_blocks=args.batch_blocks, progress=False)

    for _ in pairs():  # warm-up: tokenizer, first forwards
        break
    start = time.perf_counter()
    n_bare = sum(len(p.a_ND) for p in pairs())
    bare = time.perf_counter() - start
    start = time.perf_counter()
    stats = stream_statistics(sae_a, sae_b, pairs(), params)
    matched = time.perf_counter() - start
    print(f"SAEs: {id_a} ({sae_a.cfg.d_sae}) vs {id_b} ({sae_b.cfg.d_sae}); models {handles[0].name} / "
          f"{handles[1].name}; {args.threads} threads on {args.device}")
    print(f"bare forward of both models : {n_bare / bare:9.1f} tokens/s ({n_bare} tokens, {bare:.1f} s)")
    print(f"streamed matching            : {stats.n_tokens / matched:9.1f} tokens/s ({stats.n_tokens} tokens, "
          f"{matched:.1f} s, {params.n_rotations} rotation null)")
    print(f"ratio (matching / bare)      : {(stats.n_tokens / matched) / (n_bare / bare):.2f}")


if __name__ == "__main__":
    main()
