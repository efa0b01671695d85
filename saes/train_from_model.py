"""Train every requested dictionary of a model from one streamed forward, no cache.

`train_from_model` runs the model once per batch of corpus blocks for all hooks, stopped
after the deepest (`saes.train.stream_source.StreamSource`), and steps every dictionary on
each mixed batch in one loop (`saes.train.loop.train_dictionaries`): SAEs at any number of
hooks, or per-layer transcoders (each MLP input paired with its MLP output,
`saes.transcoders.sites`), and crosscoders of two hooks of the model (`crosscoders`; the
same dictionary `train-crosscoder` steps, `saes.compare.crosscoder`), or with `model_b` of
two models: each pair's side B is then model B's hook, B runs on the same token blocks
(stopped after its deepest requested hook; the same tokenizer is required, else
`train-crosscoder --model-b` aligns texts across tokenizers) and its rows join A's before the
mixing buffer (`saes.train.stream_source.model_b_hook`), while A's forward alone feeds the
SAEs and transcoders. The SAEs are saved,
registered in `atlas.json` and checkpointed exactly as cached training does it
(`saes.train.train_saes`), so summarize / index / eval take them like any other; a crosscoder is
saved in `crosscoders/<id>/` as `train-crosscoder` saves it. Held-out metrics come from the
blocks right after the training blocks. `train_clt_from_model` does the same for a
cross-layer transcoder (`saes.transcoders.clt_atlas`).

A killed run resumes from its checkpoint to the same final weights: the checkpoint holds
the number of batches streamed, and the current mixing window is recomputed by re-running
its forwards.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from tqdm.auto import tqdm

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.atlas_records import trained_record
from sae_atlas.saes.compare.crosscoder import (
    CROSSCODER_FILE,
    CrosscoderDictionary,
    crosscoder_config,
    crosscoder_dir,
    default_crosscoder_id,
    read_crosscoder_sides,
    write_crosscoder_sides,
)
from sae_atlas.saes.compare.pairs import same_tokenizer
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext, barrier, init_distributed
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAEConfig, architecture_class
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.dictionary import Dictionary
from sae_atlas.saes.train.loop import Distribute, LoopRun, train_dictionaries
from sae_atlas.saes.train.stream_source import StreamSource, model_b_hook
from sae_atlas.saes.train.train_saes import (
    DEFAULT_EXPANSION,
    HELDOUT_EVAL_TOKENS,
    Planned,
    completed,
    hook_seed,
    register_trained,
    remove_run,
    run_dir,
    sae_dictionaries,
    sae_id_for,
    save_trained,
    to_train,
)
from sae_atlas.saes.transcoders.clt import CLTArchitecture
from sae_atlas.saes.transcoders.clt_atlas import (
    clt_input_site,
    clt_outputs,
    clt_to_train,
    plan_clt,
    register_trained_clt,
)
from sae_atlas.saes.transcoders.clt_train import CLTDictionary
from sae_atlas.saes.transcoders.sites import mlp_output_hook
from sae_atlas.store.layout import AtlasLayout

DictDtype = Literal["float32", "bfloat16", "float16"]
DICT_DTYPES: tuple[DictDtype, ...] = get_args(DictDtype)


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """How the corpus is streamed: its blocks, the blocks per forward, the mixing buffer
    (tokens; None: derived from free memory), the held-out tokens after the training blocks
    (None: a tenth of the run, at most 262,144), the lanes (None: one per rank) and the
    dictionaries' autocast dtype (float32: none)."""

    corpus: CorpusSpec = dataclasses.field(default_factory=CorpusSpec)
    batch_blocks: int = 8
    dict_dtype: DictDtype = "float32"
    buffer_tokens: int | None = None
    heldout_tokens: int | None = None
    lanes: int | None = None


def hook_widths(handle: ModelHandle, hooks: Sequence[str]) -> dict[str, int]:
    """Each hook's width, from one forward over two tokens."""
    token = handle.bos_token_id if handle.bos_token_id is not None else 0
    acts = run_hooks(handle, torch.tensor([[token, token]]), list(hooks))
    return {hook: int(a.shape[-1]) for hook, a in acts.items()}


def _check_model(layout: AtlasLayout, handle: ModelHandle) -> None:
    """InvalidInputError when the atlas belongs to another model; records the model in a new atlas."""
    meta = layout.read_meta() if layout.atlas_json.exists() else {}
    if meta.get("model") not in (None, handle.spec):
        raise InvalidInputError(f"{layout.atlas_json} belongs to model {meta['model']!r}, not {handle.spec!r}; "
                                "use another --atlas directory")
    if meta.get("model") is None:
        layout.update_meta(model=handle.spec)


def _plan(layout: AtlasLayout, handle: ModelHandle, hooks: Sequence[str], transcode: bool, architecture: str,
          d_sae: int | None, expansion: int | None, k: int | None, options: dict[str, Any], corpus: CorpusSpec,
          seed: int) -> list[Planned]:
    """One SAE (or transcoder) per hook, configured from the model (hooks checked first)."""
    if not hooks:
        return []
    outputs = {hook: handle.check_hook(mlp_output_hook(handle.check_hook(hook))) if transcode else ""
               for hook in hooks}
    widths = hook_widths(handle, [*hooks, *filter(None, outputs.values())])
    planned = []
    for hook in hooks:
        out, d_in = outputs[hook], widths[hook]
        extra = {"hook_name_out": out, "d_out": widths[out], "apply_b_dec_to_input": False} if out else {}
        sae_cfg = SAEConfig(
            architecture=architecture, d_in=d_in, d_sae=d_sae or (expansion or DEFAULT_EXPANSION) * d_in,
            k=k if architecture_class(architecture).needs_k else None, model_name=handle.name, hook_name=hook,
            context_size=corpus.context_size, prepend_bos=corpus.prepend_bos, dataset_path=corpus.source,
            seed=hook_seed(seed, hook), **{**options, **extra})
        sae_id = sae_id_for(hook, architecture, sae_cfg.d_sae, out, sae_cfg.skip)
        planned.append(Planned(hook, out, None, sae_cfg, sae_id, layout.sae_dir(sae_id)))  # type: ignore[arg-type]
    return planned


@dataclasses.dataclass(frozen=True)
class PlannedCrosscoder:
    """One crosscoder of a streamed run: the two hooks it reads (side B of `model_b` when
    given, else of the run's model), its BatchTopK config over the joined rows, its id and
    folder (named as `to_train` reads a `Planned`)."""

    hook_a: str
    hook_b: str
    d_a: int  # side A's width: the joined rows' first columns
    sae_cfg: SAEConfig
    sae_id: str
    sae_dir: Path
    model_b: ModelHandle | None = None

    @property
    def key_b(self) -> str:
        """Side B's key in the streamed batches."""
        return self.hook_b if self.model_b is None else model_b_hook(self.hook_b)

    def sides(self, model: str) -> dict[str, Any]:
        """What A and B are, as `train-crosscoder` records them in `crosscoder.json`."""
        b = self.model_b
        return {"model_a": model, "hook_a": self.hook_a, "model_b": model if b is None else b.name,
                "hook_b": self.hook_b, "spec_b": None if b is None else b.spec}


def _check_model_b(handle: ModelHandle, model_b: ModelHandle | None, pairs: Sequence[tuple[str, str]],
                   distribute: Distribute, ctx: DistContext | None) -> None:
    """InvalidInputError for a model B the stream cannot pair: no crosscoder to read it,
    another tokenizer (token ids differ), several data-parallel ranks (module sharding is
    exact: every rank runs both models over its own lanes, the dictionaries see whole batches)."""
    if model_b is None:
        return
    if not pairs:
        raise InvalidInputError("--model-b is side B of crosscoders: add --crosscoder HOOK_A,HOOK_B (HOOK_B of "
                                "model B)")
    if not same_tokenizer(handle, model_b):
        raise InvalidInputError(
            f"model B ({model_b.name}) has another tokenizer than the atlas's model ({handle.name}); a streamed "
            "crosscoder pairs identical token ids: train it with `sae-atlas train-crosscoder --model-b`, which "
            "aligns the texts across the two tokenizers")
    if ctx is not None and ctx.world_size > 1 and distribute != "modules":
        raise InvalidInputError("--model-b under torchrun trains with --distribute-modules (each rank owns whole "
                                "dictionaries, as one process trains them); data-parallel is not supported with it")


def _plan_crosscoders(layout: AtlasLayout, handle: ModelHandle, pairs: Sequence[tuple[str, str]], d_sae: int | None,
                      expansion: int | None, k: int | None, model_b: ModelHandle | None = None,
                      overwrite: bool = False) -> list[PlannedCrosscoder]:
    """One crosscoder per pair of hooks (HOOK_B of `model_b` when given; both checked;
    InvalidInputError for a hook paired with itself, or for a crosscoder saved with other
    sides unless `overwrite`), `d_sae` latents (default `expansion` x side A's width) and `k`."""
    planned = []
    for hook_a, hook_b in pairs:
        handle.check_hook(hook_a)
        if model_b is None and handle.check_hook(hook_b) == hook_a:
            raise InvalidInputError(f"a crosscoder pairs two hooks; both sides read {hook_a!r}")
        if model_b is None:
            widths = hook_widths(handle, [hook_a, hook_b])
            d_a, d_b = widths[hook_a], widths[hook_b]
        else:
            try:
                model_b.check_hook(hook_b)
            except UnknownHookError as exc:
                raise UnknownHookError(f"model B: {exc}") from exc
            d_a, d_b = hook_widths(handle, [hook_a])[hook_a], hook_widths(model_b, [hook_b])[hook_b]
        width = d_sae or (expansion or DEFAULT_EXPANSION) * d_a
        cfg = crosscoder_config(d_a, d_b, width, k or 32, hook_name=hook_a, model_name=handle.name)
        cc_id = default_crosscoder_id(hook_a, hook_b, width)
        plan = PlannedCrosscoder(hook_a, hook_b, d_a, cfg, cc_id, crosscoder_dir(layout.root, cc_id), model_b)
        if not overwrite and (plan.sae_dir / CROSSCODER_FILE).exists():
            stored = read_crosscoder_sides(plan.sae_dir)["sides"]
            if stored != plan.sides(handle.name):
                raise InvalidInputError(f"crosscoder {cc_id!r} already exists between other sides ({stored}); "
                                        "pass overwrite=True (`--overwrite`) to replace it")
        planned.append(plan)
    if len({p.sae_id for p in planned}) < len(planned):
        raise InvalidInputError(f"the same crosscoder is asked for twice: {[list(pair) for pair in pairs]}")
    return planned


def _crosscoder_dictionaries(todo: list[PlannedCrosscoder], train_cfg: TrainConfig,
                             device: str) -> list[CrosscoderDictionary]:
    """The loop's dictionary of every planned crosscoder, built as `train-crosscoder` builds one."""
    dictionaries = []
    for p in todo:
        resolved = train_cfg.resolve(p.sae_cfg.d_in, p.sae_cfg.d_sae)
        torch.manual_seed(resolved.seed)
        dictionaries.append(CrosscoderDictionary(p.sae_cfg, resolved, device, hook_a=p.hook_a, hook_b=p.key_b,
                                                 d_a=p.d_a, name=p.sae_id))
    return dictionaries


class _Progress:
    """tokens/s, the forward's share of the time and, at each log step, every dictionary's
    FVU, L0 and dead fraction (main rank)."""

    def __init__(self, source: StreamSource, dictionaries: list[Dictionary], total: int, enabled: bool) -> None:
        self.source, self.dictionaries, self.total, self.enabled = source, dictionaries, total, enabled
        self.bar: Any = None
        self.started, self.first_step = time.perf_counter(), 0

    def __call__(self, step: int, rows: dict[str, dict[str, float]]) -> None:
        if not self.enabled:
            return
        if self.bar is None:  # the first step of this process (a resumed run starts later)
            self.bar = tqdm(total=self.total, initial=step - 1, unit="step", desc="train (model)")
            self.first_step = step - 1
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        tokens = (step - self.first_step) * self.source.batch_size
        self.bar.update(1)
        self.bar.set_postfix_str(f"{tokens / elapsed:,.0f} tok/s, forward {self.source.forward_seconds / elapsed:.0%}")
        logged = [d for d in self.dictionaries if d.history and d.history[-1]["step"] == step]
        for d in logged:
            last = d.history[-1]
            self.bar.write(f"step {step} {d.name}: FVU {last.get('fvu', float('nan')):.3f}  "
                           f"L0 {last.get('l0', float('nan')):.1f}  dead {last.get('dead_fraction', float('nan')):.1%}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _heldout_rows(source: StreamSource, n_tokens: int) -> dict[str, torch.Tensor]:
    """The held-out blocks' rows of every hook (CPU, float32; none without held-out tokens)."""
    parts = list(source.heldout_batches(max(1, n_tokens)))
    return {hook: torch.cat([p[hook] for p in parts]).cpu() for hook in source.hooks} if parts else {}


def train_from_model(
    handle: ModelHandle,
    atlas_root: str | Path,
    hooks: Sequence[str],
    *,
    architecture: str = "topk",
    d_sae: int | None = None,
    expansion: int | None = None,
    k: int | None = 32,
    sae_options: dict[str, Any] | None = None,
    train_cfg: TrainConfig | None = None,
    stream: StreamOptions | None = None,
    transcode: bool = False,
    crosscoders: Sequence[tuple[str, str]] = (),
    model_b: ModelHandle | None = None,
    distribute: Distribute = "data",
    overwrite: bool = False,
    stop_after_steps: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Train one SAE per hook (with `transcode`, one transcoder per MLP input hook) and one
    crosscoder per pair of `crosscoders` (BatchTopK over both hooks' joined rows, `d_sae`
    latents or `expansion` x side A's width, `k` per token on average; with `model_b`,
    every pair's HOOK_B is model B's, streamed on the same tokens) from
    `train_cfg.total_tokens` tokens streamed through `handle`, all stepped in one loop;
    save the SAEs in the atlas and record them in atlas.json, each crosscoder in
    `crosscoders/<id>/`. Returns `{hook: record}` of the SAEs as `train_saes` does, and
    `{crosscoder id: record}` of the crosscoders (`kind` "crosscoder"). Bad input (an
    unknown hook, a hook a transcoder cannot read, a buffer too large for memory, a corpus
    too short, module sharding over more ranks than dictionaries, a checkpoint of a cached
    run, a model B without crosscoders, with another tokenizer, module sharding or several
    ranks) is refused before any training. `stop_after_steps` ends early after a checkpoint."""
    layout = AtlasLayout(atlas_root)
    train_cfg = train_cfg or TrainConfig()
    stream = stream or StreamOptions()
    if stream.dict_dtype not in DICT_DTYPES:
        raise InvalidInputError(f"dict dtype must be one of {', '.join(DICT_DTYPES)}, got {stream.dict_dtype!r}")
    if not hooks and not crosscoders:
        raise InvalidInputError("--from-model needs the hooks to train on: --hook blocks.L.hook_resid_post ... "
                                "(or --crosscoder HOOK_A,HOOK_B)")
    ctx = init_distributed()
    _check_model_b(handle, model_b, crosscoders, distribute, ctx)
    model_b = None if model_b is handle else model_b  # the atlas's own model: one forward
    planned = _plan(layout, handle, list(dict.fromkeys(hooks)), transcode, architecture, d_sae, expansion, k,
                    dict(sae_options or {}), stream.corpus, train_cfg.seed)
    coders = _plan_crosscoders(layout, handle, crosscoders, d_sae, expansion, k, model_b, overwrite)
    if ctx is None or ctx.is_main:
        _check_model(layout, handle)
    ids = [p.sae_id for p in [*planned, *coders]]
    folder = coders[0].sae_dir if not planned and len(coders) == 1 else run_dir(layout, ids)
    todo, todo_cc = to_train(planned, train_cfg, overwrite, ctx), to_train(coders, train_cfg, overwrite, ctx)
    if todo or todo_cc:
        _train_streamed(handle, todo, todo_cc, train_cfg, stream, folder, distribute, ctx, stop_after_steps,
                        model_b)
    barrier(ctx)
    if stop_after_steps is not None and stop_after_steps < train_cfg.total_steps:
        return {}
    if ctx is None or ctx.is_main:
        remove_run(folder)
    return {**register_trained(layout, planned, train_cfg, ctx), **_crosscoder_records(coders, train_cfg)}


def _crosscoder_records(coders: list[PlannedCrosscoder], train_cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Every planned crosscoder's record by id, read back from its finished folder."""
    out = {}
    for p in coders:
        record = completed(p.sae_dir, p.sae_cfg, train_cfg)
        if record is None:
            raise InvalidInputError(f"training of crosscoder {p.sae_id} did not complete")
        out[p.sae_id] = {**trained_record(p.sae_id, p.sae_cfg, record), "kind": "crosscoder", "hook_b": p.hook_b}
    return out


def _stream_and_train(handle: ModelHandle, dictionaries: list[Dictionary], train_cfg: TrainConfig,
                      stream: StreamOptions, folder: Path, distribute: Distribute, ctx: DistContext | None,
                      stop_after_steps: int | None, model_b: ModelHandle | None = None
                      ) -> tuple[LoopRun, StreamSource]:
    """Stream the hooks the dictionaries read (model B's too) and train them in one loop
    (checkpoints in `folder`)."""
    heldout = (stream.heldout_tokens if stream.heldout_tokens is not None
               else min(HELDOUT_EVAL_TOKENS, max(stream.corpus.context_size, train_cfg.total_tokens // 10)))
    hooks = list(dict.fromkeys(h for d in dictionaries for h in d.hooks))
    source = StreamSource(handle, stream.corpus, hooks, batch_size=train_cfg.batch_size, steps=train_cfg.total_steps,
                          batch_blocks=stream.batch_blocks, buffer_tokens=stream.buffer_tokens,
                          heldout_tokens=heldout, lanes=stream.lanes, seed=train_cfg.seed, ctx=ctx,
                          model_b=model_b)
    progress = _Progress(source, dictionaries, train_cfg.total_steps, train_cfg.progress and (ctx is None or ctx.is_main))
    device_type = torch.device(dictionaries[0].device).type
    autocast = torch.autocast(device_type, dtype=getattr(torch, stream.dict_dtype), enabled=stream.dict_dtype != "float32")
    try:
        with autocast:
            run = train_dictionaries(dictionaries, source, checkpoint_dir=folder, ctx=ctx, distribute=distribute,
                                     stop_after_steps=stop_after_steps, on_step=progress)
    finally:
        progress.close()
    return run, source


def _train_streamed(handle: ModelHandle, todo: list[Planned], todo_cc: list[PlannedCrosscoder], train_cfg: TrainConfig,
                    stream: StreamOptions, folder: Path, distribute: Distribute, ctx: DistContext | None,
                    stop_after_steps: int | None, model_b: ModelHandle | None) -> None:
    """Stream, train the SAEs of `todo` and the crosscoders of `todo_cc` in one loop and save each."""
    device = train_cfg.device if ctx is None else ctx.device(train_cfg.device)
    dictionaries: list[Dictionary] = [*sae_dictionaries(todo, train_cfg, device),
                                      *_crosscoder_dictionaries(todo_cc, train_cfg, device)]
    run, source = _stream_and_train(handle, dictionaries, train_cfg, stream, folder, distribute, ctx,
                                    stop_after_steps, model_b)
    if not run.finished:
        return
    main = ctx is None or ctx.is_main
    rows = _heldout_rows(source, train_cfg.batch_size) if main or distribute == "modules" else {}

    def eval_rows(p: Planned) -> list[torch.Tensor] | None:
        x = rows.get(p.hook)
        return None if x is None else [torch.cat([x, rows[p.hook_out]], -1) if p.hook_out else x]

    save_trained(run, todo, eval_rows, ctx, distribute)
    write = distribute == "modules" or main
    world = 1 if ctx is None or distribute == "modules" else ctx.world_size
    by_id = {p.sae_id: p for p in todo_cc}
    for d in run.dictionaries:
        if not isinstance(d, CrosscoderDictionary):
            continue
        p = by_id[d.name]
        if write:  # before the weights: a folder with complete weights always has its sides
            p.sae_dir.mkdir(parents=True, exist_ok=True)
            write_crosscoder_sides(p.sae_dir, p.d_a, p.sae_cfg.d_in - p.d_a, d.sides, p.sides(handle.name))
        held = [d.sides.apply(torch.cat([rows[p.hook_a], rows[p.key_b]], 1))] if rows else None
        d.finish(p.sae_dir, held, wall_seconds=run.wall_seconds, world_size=world, write=write)


def train_clt_from_model(
    handle: ModelHandle,
    atlas_root: str | Path,
    hooks: Sequence[str],
    *,
    architecture: CLTArchitecture = "jumprelu",
    d_sae: int | None = None,
    expansion: int = 8,
    k: int | None = 32,
    options: dict[str, Any] | None = None,
    train_cfg: TrainConfig | None = None,
    stream: StreamOptions | None = None,
    overwrite: bool = False,
    stop_after_steps: int | None = None,
) -> dict[str, Any]:
    """Train a cross-layer transcoder reading `hooks` (every layer's MLP input from 0) and
    writing every MLP output from `train_cfg.total_tokens` tokens streamed through `handle`,
    save it and record it in atlas.json as `train_atlas_clt` does; returns its entry (an
    empty dict when stopped early). Runs data-parallel under torchrun."""
    layout = AtlasLayout(atlas_root)
    train_cfg = train_cfg or TrainConfig()
    stream = stream or StreamOptions()
    hooks = list(hooks)
    clt_input_site(hooks)
    for hook in [*hooks, *clt_outputs(len(hooks))]:
        handle.check_hook(hook)
    planned = plan_clt(layout, hooks, d_model=hook_widths(handle, hooks[:1])[hooks[0]], model_name=handle.name,
                       context_size=stream.corpus.context_size, dataset_path=stream.corpus.source,
                       architecture=architecture, d_sae=d_sae, expansion=expansion, k=k, options=options,
                       seed=train_cfg.seed)
    ctx = init_distributed()
    if ctx is None or ctx.is_main:
        _check_model(layout, handle)
    record = clt_to_train(planned, train_cfg, overwrite, ctx)
    if record is None:
        resolved = train_cfg.resolve(planned.cfg.d_model, planned.cfg.d_sae)
        torch.manual_seed(resolved.seed)
        clt = CLTDictionary(planned.cfg, resolved, train_cfg.device if ctx is None else ctx.device(train_cfg.device))
        run, source = _stream_and_train(handle, [clt], train_cfg, stream, planned.folder, "data", ctx,
                                        stop_after_steps)
        if not run.finished:
            return {}
        main = ctx is None or ctx.is_main
        rows = _heldout_rows(source, train_cfg.batch_size) if main else {}
        eval_rows = (torch.stack([torch.stack([rows[h] for h in hs], 1) for hs in (clt.cfg.hooks_in, clt.cfg.hooks_out)],
                                 1) if rows else None)
        record = clt.finish(planned.folder, eval_rows, wall_seconds=run.wall_seconds,
                            world_size=1 if ctx is None else ctx.world_size, write=main).record
    return register_trained_clt(layout.root, planned, record, ctx)
