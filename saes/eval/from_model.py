"""`eval --from-model`: activation metrics of SAEs over tokens streamed from model forwards.

The corpus is packed as `sae-atlas cache` packs it; each batch runs one forward for all
hooks (`saes.streaming.stream_activations`, stopped after the deepest) and every SAE's
non-BOS rows go into its `ReconstructionStats`, so no residual cache is needed and memory
is flat in the token count. Only the activation metrics (EV, FVU, L0, dead / dense, cosine, ...) are
computed; CE / KL with the SAE spliced in run on cached held-out blocks (`eval` without
`--from-model`).

Under `torchrun --nproc_per_node=R` the ranks take contiguous, near-equal shares of the
batches (`saes.distributed.rank_share`, the split the streamed summaries use); every
rank's statistics are gathered and merged exactly (`ReconstructionStats.merge_`: counts
and float64 sums, so the metrics equal one process's up to float64 rounding), and rank 0
writes eval.json.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.eval.evaluate import write_eval
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import stream_activations, whole_blocks
from sae_atlas.saes.train.reconstruction import ReconstructionStats
from sae_atlas.store.layout import AtlasLayout


def evaluate_from_model(handle: ModelHandle, atlas: str | Path, sae_ids: list[str], *, corpus: CorpusSpec,
                        n_tokens: int, batch_blocks: int = 8,
                        ctx: DistContext | None = None) -> dict[str, dict[str, Any]]:
    """Evaluate SAEs of an atlas on the first `n_tokens` tokens (whole blocks) of `corpus`
    run through `handle`, write each one's eval.json and return the records (on every
    rank of `ctx`, which split the batches; rank 0 writes)."""
    layout = AtlasLayout(atlas)
    n_blocks = whole_blocks(n_tokens, corpus)
    saes = {sae_id: load_atlas_sae(atlas, sae_id, device=handle.device).eval() for sae_id in sae_ids}
    for sae_id, sae in saes.items():
        if sae.cfg.d_in != handle.d_model:
            raise InvalidInputError(f"SAE {sae_id!r} has d_in={sae.cfg.d_in} but {handle.name} has d_model={handle.d_model}")
    hooks = {sae_id: handle.check_hook(sae.cfg.hook_name) for sae_id, sae in saes.items()}
    targets = {sae_id: handle.check_hook(sae.cfg.output_hook) for sae_id, sae in saes.items()}  # a transcoder's output
    stats = {sae_id: ReconstructionStats(sae.cfg.output_dim, sae.cfg.d_sae) for sae_id, sae in saes.items()}
    started = time.perf_counter()
    with torch.no_grad():
        for batch in stream_activations(handle, corpus, {*hooks.values(), *targets.values()}, n_blocks=n_blocks,
                                        batch_blocks=batch_blocks, progress=False, ctx=ctx):
            keep = ~batch.excluded.reshape(-1).to(handle.device)
            for sae_id, sae in saes.items():
                x = batch.acts[hooks[sae_id]].flatten(0, 1)[keep].to(sae.W_enc.dtype)
                out = sae(x)
                stats[sae_id].update(batch.acts[targets[sae_id]].flatten(0, 1)[keep].to(out.x_hat.dtype),
                                     out.x_hat.float(), out.feature_acts)
    stats = _merged(stats, ctx)
    seconds = round(time.perf_counter() - started, 3)
    records = {}
    for sae_id, sae in saes.items():
        if stats[sae_id].n == 0:
            raise InvalidInputError(f"the streamed tokens of {hooks[sae_id]!r} have no non-BOS tokens")
        parameters = {"sae_id": sae_id, "hook": hooks[sae_id], **({"hook_out": targets[sae_id]} if sae.is_transcoder
                                                                   else {}), "architecture": sae.cfg.architecture,
                      "split": "stream", "corpus": dataclasses.asdict(corpus), "n_tokens_requested": n_tokens,
                      "ce_blocks_requested": 0, "exclude_bos": True, "model": handle.name}
        records[sae_id] = {"metrics": stats[sae_id].result(), "parameters": parameters, "seconds": seconds}
        if ctx is None or ctx.is_main:
            write_eval(layout.require_sae(sae_id), records[sae_id])
    return records


def _merged(stats: dict[str, ReconstructionStats], ctx: DistContext | None) -> dict[str, ReconstructionStats]:
    """Every rank's statistics merged in rank order (this process's own without a group)."""
    if ctx is None:
        return stats
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, stats)
    return {sae_id: functools.reduce(ReconstructionStats.merge_, (part[sae_id] for part in gathered[1:]),
                                     gathered[0][sae_id]) for sae_id in stats}
