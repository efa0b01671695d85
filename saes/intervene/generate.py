"""Seeded generation with and without edits, and the next-token distribution shift.

`generate_batch` continues several prompts (or one prompt under several splices) in one
batch with a KV cache (`saes.intervene.decode`: prompts left-padded, each new token one
forward pass of the new position only); it decodes greedily (`temperature=0`) or samples,
each row from its own generator seeded with `seed`, so a row continues exactly as it would
alone. `generate_tokens` is one row of it. `compare` generates the baseline (SAEs spliced,
no edits) and the edited continuation in one batch with the same seed and reports how the
first next-token distribution moved: the tokens that rise and fall most in probability and
`KL(baseline || edited)`.

`decode_steps` and `compare_steps` are the same generations yielded one step at a time (for
streaming); `generate_batch` and `compare` run them to the end.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.tokens import piece_text
from sae_atlas.saes.intervene.decode import cached_decoding
from sae_atlas.saes.intervene.splice import Splice, stack_splices
from sae_atlas.saes.models import ModelHandle


@dataclass
class TokenShift:
    token: str
    token_id: int
    p_baseline: float
    p_edited: float


@dataclass
class Generation:
    """Baseline vs edited continuation of one prompt, and the next-token shift."""

    prompt: str
    baseline_ids: list[int]
    edited_ids: list[int]
    baseline_text: str
    edited_text: str
    rising: list[TokenShift]
    falling: list[TokenShift]
    kl: float  # KL(baseline || edited) of the next-token distributions, nats


def _check_masks_cover(prompts: Sequence[torch.Tensor], splices: Sequence[Splice], max_new_tokens: int) -> None:
    """Every edit's mask covers each position its row feeds the model."""
    for prompt, splice in zip(prompts, splices, strict=True):
        need = len(prompt) + max(max_new_tokens - 1, 0)
        short = [e.spec.kind for e in splice.edits if e.mask_T.shape[-1] < need]
        if short:
            raise InvalidInputError(f"{', '.join(short)} edit positions cover fewer than the {need} tokens of the "
                                    "prompt and its continuation (compile them with n_total >= prompt + new tokens)")


def _next_token(logits_V: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature == 0:
        return int(logits_V.argmax())
    return int(torch.multinomial(torch.softmax(logits_V / temperature, -1), 1, generator=gen))


@dataclass
class DecodeStep:
    """One decoding step of a batch."""

    index: int  # 0 for the first new token
    tokens: list[int | None]  # the new token of each row; None for a row that already stopped (EOS)
    logits_BV: torch.Tensor  # the next-token logits the tokens were picked from


def decode_steps(
    handle: ModelHandle,
    prompts: Sequence[torch.Tensor],
    splices: Sequence[Splice],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_at_eos: bool = True,
) -> Iterator[DecodeStep]:
    """The steps of `generate_batch`, one new token per row at a time, while the model keeps
    its KV cache and the splices' hooks (consume it in one thread; closing it early removes
    the hooks and stops the generation)."""
    if temperature < 0:
        raise InvalidInputError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompts) != len(splices) or not prompts:
        raise InvalidInputError(f"need one splice per prompt, got {len(prompts)} prompts and {len(splices)} splices")
    _check_masks_cover(prompts, splices, max_new_tokens)
    gens = [torch.Generator().manual_seed(seed) for _ in prompts]
    eos = handle.tokenizer.eos_token_id
    done = [False] * len(prompts)
    with cached_decoding(handle, prompts, stack_splices(splices)) as decoder:
        logits_BV = decoder.prefill().cpu()
        for step in range(max_new_tokens):
            picked = [_next_token(logits_V, temperature, gen) for logits_V, gen in zip(logits_BV, gens, strict=True)]
            yield DecodeStep(step, [None if stopped else token for token, stopped in zip(picked, done, strict=True)],
                             logits_BV)
            done = [stopped or (stop_at_eos and token == eos) for token, stopped in zip(picked, done, strict=True)]
            if all(done) or step == max_new_tokens - 1:
                break
            logits_BV = decoder.step(torch.tensor(picked)).cpu()


def _collect(steps: Iterator[DecodeStep], n_rows: int) -> Generator[DecodeStep, None, list[tuple[list[int], torch.Tensor]]]:
    """Pass `steps` on and return each row's new token ids and its first step's logits `[V]`."""
    new: list[list[int]] = [[] for _ in range(n_rows)]
    first_BV = torch.empty(0)
    for step in steps:
        first_BV = step.logits_BV if step.index == 0 else first_BV
        for row, token in enumerate(step.tokens):
            if token is not None:
                new[row].append(token)
        yield step
    return list(zip(new, first_BV, strict=True))


R = TypeVar("R")


def run_to_end(steps: Generator[Any, None, R]) -> R:
    """What a step generator returns, once it has run to its end."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def generate_batch(
    handle: ModelHandle,
    prompts: Sequence[torch.Tensor],
    splices: Sequence[Splice],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_at_eos: bool = True,
) -> list[tuple[list[int], torch.Tensor]]:
    """For each row `b` (prompt ids `prompts[b]` `[T_b]` with `splices[b]` applied; every
    splice with the same SAEs): the new token ids and the first step's next-token logits `[V]`."""
    steps = decode_steps(handle, prompts, splices, max_new_tokens=max_new_tokens, temperature=temperature,
                         seed=seed, stop_at_eos=stop_at_eos)
    return run_to_end(_collect(steps, len(prompts)))


def generate_tokens(
    handle: ModelHandle,
    prompt_ids_T: torch.Tensor,
    splice: Splice,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_at_eos: bool = True,
) -> tuple[list[int], torch.Tensor]:
    """New token ids and the first step's next-token logits `[V]` of the spliced model."""
    return generate_batch(handle, [prompt_ids_T], [splice], max_new_tokens=max_new_tokens,
                          temperature=temperature, seed=seed, stop_at_eos=stop_at_eos)[0]


def distribution_shift(
    tokenizer: Any, base_V: torch.Tensor, edit_V: torch.Tensor, k: int = 10
) -> tuple[list[TokenShift], list[TokenShift], float]:
    """The `k` tokens whose probability rises most and falls most, and KL(base || edited)."""
    logp, logq = torch.log_softmax(base_V.double(), -1), torch.log_softmax(edit_V.double(), -1)
    p, q = logp.exp(), logq.exp()
    kl = float((p * (logp - logq)).sum())
    diff = q - p

    def rows(idx: torch.Tensor) -> list[TokenShift]:
        return [TokenShift(piece_text(tokenizer, int(i)), int(i), float(p[i]), float(q[i])) for i in idx]

    return rows(diff.topk(k).indices), rows((-diff).topk(k).indices), kl


def compare_steps(
    handle: ModelHandle,
    prompt: str,
    prompt_ids_T: torch.Tensor,
    baseline: Splice,
    edited: Splice,
    *,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    seed: int = 0,
    k: int = 10,
) -> Generator[DecodeStep, None, Generation]:
    """The steps of `compare` (row 0 the baseline, row 1 the edited continuation); returns
    its `Generation` when run to the end."""
    steps = decode_steps(handle, [prompt_ids_T, prompt_ids_T], [baseline, edited], max_new_tokens=max_new_tokens,
                         temperature=temperature, seed=seed)
    (base_ids, base_V), (edit_ids, edit_V) = yield from _collect(steps, 2)
    rising, falling, kl = distribution_shift(handle.tokenizer, base_V, edit_V, k)
    tok = handle.tokenizer
    return Generation(prompt, base_ids, edit_ids, tok.decode(base_ids), tok.decode(edit_ids), rising, falling, kl)


def compare(
    handle: ModelHandle,
    prompt: str,
    prompt_ids_T: torch.Tensor,
    baseline: Splice,
    edited: Splice,
    *,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    seed: int = 0,
    k: int = 10,
) -> Generation:
    """Generate from `baseline` and `edited` (the same SAEs) with the same seed, in one
    batch; see the module docstring."""
    return run_to_end(compare_steps(handle, prompt, prompt_ids_T, baseline, edited, max_new_tokens=max_new_tokens,
                                    temperature=temperature, seed=seed, k=k))
