"""Summarization throughput vs encoding alone, on a synthetic cache of SmolLM2-like shape.

    python bench/summarize_throughput.py [--tokens 16384] [--d-in 576] [--d-sae 4608]
                                         [--arch topk] [--k 32] [--batch-tokens 4096]

Both runs read the same cached blocks in this process: (a) `sae.encode` over every batch
and nothing else; (b) `summarize_blocks` (encode + statistics, histograms, exact top-k,
band sampling, occurrence spool). It prints tokens/s of each and the ratio (b)/(a), the
accumulator state size, and the one-off cost of logit effects against a random
unembedding of SmolLM2's vocabulary size.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def _cache(root: str, tokens: int, d_in: int, context: int) -> None:
    from sae_atlas.store.activations import ActivationWriter

    gen = torch.Generator().manual_seed(0)
    writer = ActivationWriter(root, "blocks.0.hook_resid_post", d=d_in, context_size=context,
                              bos_token_id=1, shard_blocks=64)
    mean = torch.randn(d_in, generator=gen)
    for start in range(0, tokens // context, 16):
        acts = mean + torch.randn(16, context, d_in, generator=gen)
        toks = torch.randint(3, 49152, (16, context), generator=gen)
        toks[:, 0] = 1
        writer.append(acts, toks, torch.arange(start, start + 16))
    writer.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--d-in", type=int, default=576)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--arch", default="topk")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()

    from sae_atlas.saes.encoding.codes import sae_codes
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig
    from sae_atlas.saes.summary.accumulator import SummaryParams
    from sae_atlas.saes.summary.logits import logit_effects
    from sae_atlas.saes.summary.run import block_batches, summarize_blocks
    from sae_atlas.store.activations import ActivationReader
    from sae_atlas.store.layout import AtlasLayout
    from sae_atlas.store.tables import OccurrenceWriter

    sae = build_sae(SAEConfig(architecture=args.arch, d_in=args.d_in, d_sae=args.d_sae, k=args.k)).eval()
    with tempfile.TemporaryDirectory() as root:
        _cache(root, args.tokens, args.d_in, args.context)
        reader = ActivationReader(root, "blocks.0.hook_resid_post")
        n_tokens = reader.count_tokens("all")
        batch_blocks = max(1, args.batch_tokens // args.context)
        list(reader.blocks("all"))  # page the shards in once for both runs
        start = time.perf_counter()
        with torch.no_grad():
            for chunk in block_batches(reader.blocks("all"), batch_blocks):
                sae_codes(sae, chunk.acts.reshape(-1, args.d_in))
        encode_s = time.perf_counter() - start
        AtlasLayout(root).sae_dir("bench").mkdir(parents=True)
        occurrence = OccurrenceWriter(root, "bench", args.d_sae)
        start = time.perf_counter()
        acc = summarize_blocks(sae, reader.blocks("all"), SummaryParams(), batch_tokens=args.batch_tokens,
                               occurrence=occurrence)
        occurrence.finish()
        features = acc.features_frame(sae.W_dec.norm(dim=1), None, None)
        examples = acc.examples_frame(None)
        summarize_s = time.perf_counter() - start
    W_U = torch.randn(args.d_in, args.vocab)
    start = time.perf_counter()
    logit_effects(sae.W_dec, W_U, final_norm_weight=torch.ones(args.d_in))
    logits_s = time.perf_counter() - start
    print(f"{args.arch} SAE d_in {args.d_in} d_sae {args.d_sae} k {args.k}; {n_tokens} tokens, "
          f"batch {args.batch_tokens} tokens, {torch.get_num_threads()} threads")
    print(f"encode only             {n_tokens / encode_s:9.1f} tok/s")
    print(f"summarize (all tables)  {n_tokens / summarize_s:9.1f} tok/s   ({features.height} latents, "
          f"{examples.height} examples)")
    print(f"ratio summarize/encode  {encode_s / summarize_s:9.3f}")
    print(f"accumulator state       {acc.state_nbytes() / 2**20:9.1f} MiB (independent of tokens)")
    print(f"logit effects           {logits_s:9.2f} s once per SAE (vocab {args.vocab})")


if __name__ == "__main__":
    main()
