"""Output scores: what steering with each feature of an SAE does to the next token.

For every latent `f` the decoder row `W_dec[f]`, scaled to `alpha_f = strength *
mean_active_act_f` (the latent's typical active value from the summaries; 0 for a dead
latent), is added at the SAE's hook at the LAST position of a fixed, seeded set of neutral
prompts from the built-in corpus. Steering the last position changes only that position's
computation, so the prompts' prefixes run once into a KV cache (`saes.intervene.decode`)
and each batch runs only the last token, one row per (feature, prompt), each row with its
own steering vector (`last_token_steering`; equal to a full spliced forward with a steer
edit at `at="last"`, see the tests).

Per latent, over the prompts (Arad, Mueller and Belinkov 2025, "SAEs are good for steering
- if you select the right features"), with `p` the steered and `q` the clean next-token
distribution over the vocabulary `V` and `L_f` the latent's top logit-lens tokens
(`top_logit_ids` of the summaries):

- `output_score = mean_prompts[(1 - r_f / |V|) * m_f]` where `m_f = max_{t in L_f} p(t)`
  and `r_f = min_{t in L_f} rank_p(t)`, the 0-based rank (`#{v : p(v) > p(t)}`); the best
  rank belongs to the most probable lens token, so `r_f = #{v : p(v) > m_f}`;
- `lens_top_prob = mean m_f` and `lens_best_rank = mean r_f`;
- `kl = mean KL(q || p)`;
- the `top_k` tokens whose mean log-probability change `log p - log q` is largest
  (`promoted_*`) and smallest (`suppressed_*`).

The cheap screen (`lens_z > 0`): before any forward, each latent's decoder row goes
through the final norm and the unembedding (`saes.summary.logits` convention) and its
logit-lens peak is z-scored over the vocabulary, `z_f = (max_v l_fv - mean_v l_fv) / std_v
l_fv`; only live latents (a typical active value above 0) with `z_f >= lens_z` are
measured, and the table holds their rows only. A dead latent's row (alpha 0) says nothing,
so with the screen it is always left out. The screen costs one `[F, D] x [D, V]` product
(`bench/steering_screen.py` times it against a forward and says how many of the best
measured latents it keeps).

Under torchrun chunk `i` is computed by rank `i mod R` (each writes its own chunk files);
rank 0 joins them once every rank is done.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import atlas_sae_hook, load_atlas_sae
from sae_atlas.saes.builtin_text import builtin_documents
from sae_atlas.saes.distributed import DistContext, all_reduce_, barrier, rank_and_world
from sae_atlas.saes.hook_fns import in_residual
from sae_atlas.saes.intervene.decode import cached_decoding
from sae_atlas.saes.intervene.splice import Splice
from sae_atlas.saes.intervene.steering_params import SteeringParams
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.summary.logits import logit_directions
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.steering import STEERING_FILE, SteeringChunks, steering_is_current
from sae_atlas.store.tables import FeatureTables, summarize_repair


def neutral_prompts(handle: ModelHandle, n: int, n_tokens: int, seed: int) -> torch.Tensor:
    """Token ids `[n, n_tokens]` (BOS first) of the first `n` built-in corpus documents, in
    the order `seed` fixes, that have at least `n_tokens` tokens, each cut to `n_tokens`."""
    if n < 1 or n_tokens < 2:
        raise InvalidInputError(f"need at least 1 prompt of at least 2 tokens, got {n} of {n_tokens}")
    rows = []
    for _, text in builtin_documents(seed):
        ids = handle.to_tokens(text)[0]
        if len(ids) >= n_tokens:
            rows.append(ids[:n_tokens].cpu())
            if len(rows) == n:
                return torch.stack(rows)
    raise InvalidInputError(f"the built-in corpus has only {len(rows)} documents of {n_tokens} tokens or more")


@contextmanager
def last_token_steering(handle: ModelHandle, prompts_PT: torch.Tensor,
                        hook: str) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """A function `steered(delta_FD) -> logits [F, P, V]`: the next-token logits of every
    prompt with `delta_FD[f]` added to `hook`'s output at the last position (row `f` of the
    answer; `delta_FPD[f, p]` for one vector per prompt); the prefixes `prompts_PT[:, :-1]`
    run once, on entry, into a KV cache."""
    handle.check_hook(hook)
    n_prompts = len(prompts_PT)
    steer: dict[str, torch.Tensor] = {}

    def add_at_last(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
        act = act.clone()
        act[:, -1] += steer["BD"].to(act)
        return act

    with cached_decoding(handle, list(prompts_PT[:, :-1]), Splice()) as decoder:
        decoder.prefill()
        last_B1 = prompts_PT[:, -1:].to(handle.device)

        def steered(delta_FD: torch.Tensor) -> torch.Tensor:
            n = len(delta_FD)
            cache = copy.deepcopy(decoder.cache)
            cache.batch_repeat_interleave(n)  # row p * n + f: prompt p steered by feature f
            kwargs = {k: cache if v is decoder.cache else v for k, v in decoder.cache_kwargs.items()}
            per_row = delta_FD.repeat(n_prompts, 1) if delta_FD.ndim == 2 else delta_FD.transpose(0, 1).flatten(0, 1)
            steer["BD"] = per_row.to(handle.device)
            logits = handle.bridge.forward(last_B1.repeat_interleave(n, 0), **kwargs)[:, -1].float()
            return logits.view(n_prompts, n, -1).transpose(0, 1)

        with handle.bridge.hooks(fwd_hooks=in_residual(handle.bridge, [(hook, add_at_last)])):
            yield steered


def score_steering(steered_FPV: torch.Tensor, clean_PV: torch.Tensor, lens_ids_FK: torch.Tensor,
                   top_k: int) -> dict[str, np.ndarray]:
    """Per latent the statistics of the module docstring, from the steered logits
    `[F, P, V]`, the clean ones `[P, V]` and each latent's logit-lens tokens `[F, K]`."""
    logp = torch.log_softmax(steered_FPV.float(), -1)
    logq = torch.log_softmax(clean_PV.float(), -1)[None]
    kl_FP = (logq.exp() * (logq - logp)).sum(-1)
    delta_FV = (logp - logq).mean(1)
    best_FP = logp.gather(-1, lens_ids_FK[:, None, :].expand(-1, logp.shape[1], -1).to(logp.device)).amax(-1)
    rank_FP = (logp > best_FP[..., None]).sum(-1).float()
    score_FP = (1 - rank_FP / logp.shape[-1]) * best_FP.exp()
    up, down = delta_FV.topk(top_k, -1), (-delta_FV).topk(top_k, -1)
    return {
        "output_score": score_FP.mean(1).cpu().numpy(), "lens_top_prob": best_FP.exp().mean(1).cpu().numpy(),
        "lens_best_rank": rank_FP.mean(1).cpu().numpy(), "kl": kl_FP.mean(1).cpu().numpy(),
        "promoted_ids": up.indices.cpu().numpy(), "promoted_deltas": up.values.cpu().numpy(),
        "suppressed_ids": down.indices.cpu().numpy(), "suppressed_deltas": (-down.values).cpu().numpy(),
    }


def lens_token_matrix(top_logit_ids: list[list[int] | None], what: str) -> torch.Tensor:
    """Each latent's logit-lens token ids as a `[F, K]` tensor (short lists padded with
    their first id, which leaves the max and the best rank unchanged)."""
    width = max((len(ids or []) for ids in top_logit_ids), default=0)
    if width == 0 or any(not ids for ids in top_logit_ids):
        raise InvalidInputError(f"{what} records no top logit tokens (summarized without the model)")
    return torch.tensor([list(ids) + [ids[0]] * (width - len(ids)) for ids in top_logit_ids], dtype=torch.long)


def steering_chunk(steered: Callable[[torch.Tensor], torch.Tensor], clean_PV: torch.Tensor, W_dec_FD: torch.Tensor,
                   latents: np.ndarray, alpha_F: np.ndarray, lens_ids_FK: torch.Tensor, top_k: int) -> pl.DataFrame:
    """The steering rows of `latents` (decoder rows `W_dec_FD`, strengths `alpha_F`)."""
    delta_FD = torch.as_tensor(alpha_F, dtype=torch.float32, device=W_dec_FD.device)[:, None] * W_dec_FD.float()
    stats = score_steering(steered(delta_FD), clean_PV, lens_ids_FK, top_k)
    return pl.DataFrame({"latent": latents, "alpha": alpha_F, **{k: list(v) if v.ndim == 2 else v
                                                                 for k, v in stats.items()}})


@torch.no_grad()
def lens_peaks(handle: ModelHandle, W_dec_FD: torch.Tensor, chunk: int = 512) -> np.ndarray:
    """Per latent the z-score over the vocabulary of its decoder row's largest logit-lens
    effect (module docstring), in chunks of latents."""
    W_U = handle.W_U.detach().float()
    out = []
    for start in range(0, len(W_dec_FD), chunk):
        d = logit_directions(W_dec_FD[start:start + chunk].float(), handle.final_norm_weight, handle.final_norm_kind)
        logits = d.to(W_U.device) @ W_U
        mean, std = logits.mean(-1), logits.std(-1).clamp_min(1e-12)
        out.append(((logits.amax(-1) - mean) / std).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


def screened_latents(handle: ModelHandle, W_dec_FD: torch.Tensor, alpha_F: np.ndarray, lens_z: float) -> np.ndarray:
    """The latents a table measures: every one when `lens_z` is 0, else the live ones whose
    logit-lens peak reaches `lens_z` (module docstring)."""
    if lens_z < 0 or not math.isfinite(lens_z):
        raise InvalidInputError(f"lens_z must be a z-score >= 0 (0: no screen), got {lens_z!r}")
    if lens_z == 0:
        return np.arange(len(alpha_F), dtype=np.int32)
    return np.flatnonzero((alpha_F > 0) & (lens_peaks(handle, W_dec_FD) >= lens_z)).astype(np.int32)


@dataclass
class SteeringReport:
    """What `compute_steering_scores` did."""

    sae_id: str
    path: str  # of the written table
    n_latents: int
    chunks_computed: int
    chunks_resumed: int
    current: bool = False  # the stored table was current: nothing was computed
    measured: int = 0  # latents that passed the screen (all of them without one)


def compute_steering_scores(handle: ModelHandle, root: str | Path, sae_id: str,
                            params: SteeringParams = SteeringParams(), *, progress: bool = True,
                            ctx: DistContext | None = None, force: bool = False) -> SteeringReport:
    """Measure and store the steering table of a summarized SAE (`store.steering`), chunk
    by chunk; chunks finished by a killed run with the same parameters are kept, and a
    finished table of the same parameters and weights is kept as it is (`current`) unless
    `force`. Under torchrun (`ctx`) the ranks take the chunks in turn and rank 0 writes the table."""
    tables = FeatureTables(root, sae_id).features
    lens = lens_token_matrix(tables["top_logit_ids"].to_list(), f"the summary of SAE {sae_id!r}")
    if lens.max() >= handle.d_vocab:
        raise InvalidInputError(f"the summary of SAE {sae_id!r} names tokens outside the model's vocabulary; "
                                f"{summarize_repair(root, sae_id)}")
    alpha = params.strength * np.nan_to_num(tables["mean_active_act"].to_numpy().astype(np.float32))
    sae = load_atlas_sae(root, sae_id, device=handle.device)
    hook = sae.cfg.hook_name_out or atlas_sae_hook(root, sae_id)  # where the decoder writes (a transcoder's output)
    recorded = {k: v for k, v in asdict(params).items() if k != "lens_z" or v}  # unscreened: as tables before it
    run = {**recorded, "hook": hook, "model": handle.name, "lens_tokens": int(lens.shape[1])}
    if not force and steering_is_current(root, sae_id, run):
        return SteeringReport(sae_id, str(AtlasLayout(root).sae_dir(sae_id) / STEERING_FILE), len(tables), 0, 0,
                              current=True)
    measured = screened_latents(handle, sae.W_dec.detach(), alpha, params.lens_z)
    if not len(measured):
        raise InvalidInputError(f"no latent of SAE {sae_id!r} passes the logit-lens screen (z >= {params.lens_z:g}); "
                                "give a lower --lens-z, or 0 to measure every latent")
    prompts = neutral_prompts(handle, params.n_prompts, params.prompt_tokens, params.seed)
    rank, world = rank_and_world(ctx)
    if rank != 0:
        barrier(ctx)  # rank 0 first: it discards a stale run's chunks
    chunks = SteeringChunks(root, sae_id, run)
    if rank == 0:
        barrier(ctx)
    n_chunks = math.ceil(len(measured) / params.chunk)
    mine = range(rank, n_chunks, world)
    computed = 0
    with last_token_steering(handle, prompts, hook) as steered, \
            tqdm(total=len(mine), unit="chunk", desc=f"steering {sae_id}", disable=not progress or rank != 0) as bar:
        clean = steered(torch.zeros(1, sae.W_dec.shape[1]))[0]
        for i in mine:
            if not chunks.done(i):
                part = measured[i * params.chunk:(i + 1) * params.chunk]
                chunks.write(i, steering_chunk(steered, clean, sae.W_dec.detach()[torch.as_tensor(part)], part,
                                               alpha[part], lens[torch.as_tensor(part)], params.top_k))
                computed += 1
            bar.update(1)
    computed = int(all_reduce_(torch.tensor([computed], device=handle.device), ctx)[0])
    path = chunks.finish(n_chunks) if rank == 0 else chunks.folder.parent / STEERING_FILE
    barrier(ctx)
    return SteeringReport(sae_id, str(path), len(tables), computed, n_chunks - computed, measured=len(measured))
