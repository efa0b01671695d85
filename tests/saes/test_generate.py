"""KV-cached and batched generation on tiny models: every step's logits match a full
forward pass of the whole sequence (`run_spliced`), for SAEs spliced alone and for each edit
kind at each kind of position; a batch (left-padded prompts, or one prompt under several
edit settings) continues each row exactly as generating it alone does."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.intervene.decode import cached_decoding
from sae_atlas.saes.intervene.edits import (
    AblateEdit,
    CirclePlane,
    ClampEdit,
    ProjectOutEdit,
    RotateEdit,
    ScaleEdit,
    SteerEdit,
    TokenMatch,
    compile_edit,
    resolve_positions,
)
from sae_atlas.saes.intervene.generate import compare, generate_batch, generate_tokens
from sae_atlas.saes.intervene.splice import Splice, run_spliced, stack_splices
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

TEXT = "the cat sat on the mat and the dog ran"
PROMPTS = [TEXT, "a red car", "one two three four five six"]
N_NEW = 6
ATOL = 1e-4
SAE_HOOK = "blocks.1.hook_resid_post"
PLANE_HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def handle(request):
    return tiny_model(arch=request.param, n_layers=3, seed=1)


def _sae(handle):
    cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=64, k=8, hook_name=SAE_HOOK, seed=3)
    sae = build_sae(cfg).eval()
    with torch.no_grad():  # an encoder bias that makes features fire, so the SAE is in the path
        sae.b_enc.fill_(0.05)
    return sae


@pytest.fixture(scope="module")
def sae(handle):
    return _sae(handle)


def _plane(d_model: int) -> CirclePlane:
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.normal(size=(d_model, 2)))
    return CirclePlane(PLANE_HOOK, 7, 0.1 * rng.normal(size=d_model), U, np.array([[2.0, 0.3], [-0.4, 1.5]]),
                       np.array([0.2, -0.1]))


def _ids(handle, text: str) -> torch.Tensor:
    return handle.to_tokens(text)[0]


def _splice(handle, sae, prompt_T: torch.Tensor, specs: list, n_new: int = N_NEW) -> Splice:
    """The SAE spliced at SAE_HOOK and `specs` compiled against the prompt plus `n_new`."""
    tokens = decoded_tokens(handle.tokenizer, prompt_T.tolist())
    n = len(tokens)
    edits = []
    for spec in specs:
        mask = resolve_positions(spec.at, tokens, n, n + n_new)
        if spec.kind == "rotate":
            edits.append(compile_edit(spec, mask, hook=PLANE_HOOK, plane=_plane(handle.d_model)))
        else:
            edits.append(compile_edit(spec, mask, sae=sae, hook=SAE_HOOK))
    return Splice({"s": (SAE_HOOK, sae)}, edits)


def _cached_steps(handle, prompts, splices, n_new: int = N_NEW) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy new ids `[B, n_new]` and the logits `[B, n_new, V]` of every step, decoded in one
    batch with the KV cache."""
    with cached_decoding(handle, prompts, stack_splices(splices)) as decoder:
        steps = [decoder.prefill()]
        for _ in range(n_new - 1):
            steps.append(decoder.step(steps[-1].argmax(-1)))
    logits = torch.stack(steps, 1)
    return logits.argmax(-1), logits


def _full_forward_steps(handle, prompt_T, splice, new_ids) -> torch.Tensor:
    """Reference without a cache: for each step, a full forward pass of the prompt and the
    tokens generated before it; the last position's logits `[n_new, V]`."""
    seq = torch.cat([prompt_T, torch.as_tensor(new_ids)])
    n = len(prompt_T)
    return torch.stack([run_spliced(handle, seq[: n + s], splice).logits_TV[-1] for s in range(len(new_ids))])


def _check_against_full_forward(handle, prompts, splices, n_new: int = N_NEW) -> torch.Tensor:
    ids, logits = _cached_steps(handle, prompts, splices, n_new)
    for row, (prompt, splice) in enumerate(zip(prompts, splices, strict=True)):
        ref = _full_forward_steps(handle, prompt, splice, ids[row])
        diff = float((logits[row] - ref).abs().max())
        assert diff <= ATOL, (row, diff)
    return logits


# each case as a function of a feature that fires on the prompt (so scale / ablate act)
EDITS = {
    "splice only": lambda f: [],
    "steer all": lambda f: [SteerEdit(sae="s", feature=3, alpha=3.0)],
    # true at position 0: a new token's hook must see its own position (n, n+1, ...), not 0
    "steer first and last": lambda f: [SteerEdit(sae="s", feature=5, alpha=4.0, at=[0, -1])],
    "clamp last": lambda f: [ClampEdit(sae="s", feature=2, value=6.0, at="last")],
    "scale matched": lambda f: [ScaleEdit(sae="s", feature=f, factor=4.0, at=TokenMatch(match="the"))],
    "ablate all": lambda f: [AblateEdit(sae="s", feature=f)],
    "project_out all": lambda f: [ProjectOutEdit(sae="s", features=[0, 1, 2, 3])],
    "rotate all": lambda f: [RotateEdit(circle="c", steps=2)],
    "mixed": lambda f: [SteerEdit(sae="s", feature=3, alpha=-2.0, at=[1]), ClampEdit(sae="s", feature=7, value=3.0),
                        RotateEdit(circle="c", steps=1, at="last")],
}


def _firing_feature(handle, sae, prompt_T) -> int:
    """The feature with the largest activation on the prompt."""
    codes = run_spliced(handle, prompt_T, Splice({"s": (SAE_HOOK, sae)})).codes["s"]
    return int(codes.max(0).values.argmax())


@pytest.mark.parametrize("case", list(EDITS))
def test_cached_steps_match_full_forward(handle, sae, case):
    prompt = _ids(handle, TEXT)
    specs = EDITS[case](_firing_feature(handle, sae, prompt))
    splice = _splice(handle, sae, prompt, specs)
    logits = _check_against_full_forward(handle, [prompt], [splice])
    if specs:  # the edit really acts (on the prompt's next-token logits)
        plain = run_spliced(handle, prompt, Splice(splice.saes)).logits_TV[-1]
        assert float((logits[0, 0] - plain).abs().max()) > 1e-3


def test_generate_tokens_matches_the_full_forward_loop(handle, sae):
    """Greedy and seeded sampling give the tokens a full forward pass per token gives."""
    prompt = _ids(handle, TEXT)
    splice = _splice(handle, sae, prompt, [SteerEdit(sae="s", feature=3, alpha=2.0)], n_new=8)
    for temperature in (0.0, 1.0):
        gen = torch.Generator().manual_seed(3)
        want, seq = [], prompt
        for _ in range(8):
            logits_V = run_spliced(handle, seq, splice).logits_TV[-1]
            if temperature == 0:
                nxt = int(logits_V.argmax())
            else:
                nxt = int(torch.multinomial(torch.softmax(logits_V / temperature, -1), 1, generator=gen))
            want.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])
        got, first = generate_tokens(handle, prompt, splice, max_new_tokens=8, temperature=temperature, seed=3,
                                     stop_at_eos=False)
        assert got == want, temperature
        assert float((first - run_spliced(handle, prompt, splice).logits_TV[-1]).abs().max()) <= ATOL


def test_batched_prompts_match_one_by_one(handle, sae):
    """Left-padded prompts of different lengths, each with its own edits, in one batch."""
    prompts = [_ids(handle, p) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    specs = [[SteerEdit(sae="s", feature=3, alpha=3.0)],
             [ClampEdit(sae="s", feature=2, value=6.0, at="last"), RotateEdit(circle="c", steps=2, at=[0, 1])],
             [ScaleEdit(sae="s", feature=5, factor=-2.0, at=TokenMatch(match="three")),
              ProjectOutEdit(sae="s", features=[1, 4])]]
    splices = [_splice(handle, sae, p, s) for p, s in zip(prompts, specs, strict=True)]
    _check_against_full_forward(handle, prompts, splices)
    batch = generate_batch(handle, prompts, splices, max_new_tokens=N_NEW, temperature=1.0, seed=5,
                           stop_at_eos=False)
    for (ids, first), prompt, splice in zip(batch, prompts, splices, strict=True):
        alone_ids, alone_first = generate_tokens(handle, prompt, splice, max_new_tokens=N_NEW, temperature=1.0,
                                                 seed=5, stop_at_eos=False)
        assert ids == alone_ids
        assert float((first - alone_first).abs().max()) <= ATOL


def test_a_sweep_of_edit_settings_in_one_batch(handle, sae):
    prompt = _ids(handle, TEXT)
    alphas = [0.0, 2.0, 8.0, -4.0]
    splices = [_splice(handle, sae, prompt, [SteerEdit(sae="s", feature=3, alpha=a)]) for a in alphas]
    logits = _check_against_full_forward(handle, [prompt] * len(alphas), splices)
    assert float((logits[0, 0] - logits[2, 0]).abs().max()) > 1e-2  # the rows really differ
    batch = generate_batch(handle, [prompt] * len(alphas), splices, max_new_tokens=N_NEW, stop_at_eos=False)
    for (ids, _), splice in zip(batch, splices, strict=True):
        assert ids == generate_tokens(handle, prompt, splice, max_new_tokens=N_NEW, stop_at_eos=False)[0]


def test_rows_stop_at_their_own_eos(handle, sae):
    prompts = [_ids(handle, p) for p in PROMPTS[:2]]
    splices = [Splice({"s": (SAE_HOOK, sae)})] * 2
    free = generate_batch(handle, prompts, splices, max_new_tokens=N_NEW, stop_at_eos=False)
    eos = free[0][0][2]  # pretend the third token of row 0 ends a sequence
    stopping = dataclasses.replace(handle, tokenizer=SimpleNamespace(eos_token_id=eos))
    got = generate_batch(stopping, prompts, splices, max_new_tokens=N_NEW)
    assert got[0][0] == free[0][0][: free[0][0].index(eos) + 1]
    row1 = free[1][0]
    assert got[1][0] == (row1[: row1.index(eos) + 1] if eos in row1 else row1)


def test_compare_batches_baseline_and_edited(handle, sae):
    prompt = _ids(handle, TEXT)
    base = Splice({"s": (SAE_HOOK, sae)})
    edited = _splice(handle, sae, prompt, [SteerEdit(sae="s", feature=3, alpha=5.0)])
    gen = compare(handle, TEXT, prompt, base, edited, max_new_tokens=N_NEW, temperature=1.0, seed=2)
    assert gen.baseline_ids == generate_tokens(handle, prompt, base, max_new_tokens=N_NEW, temperature=1.0, seed=2)[0]
    assert gen.edited_ids == generate_tokens(handle, prompt, edited, max_new_tokens=N_NEW, temperature=1.0, seed=2)[0]
    assert gen.kl > 0


def test_batches_refuse_mixed_saes_and_short_masks(handle, sae):
    prompt = _ids(handle, TEXT)
    other = Splice({"s": (SAE_HOOK, _sae(handle))})
    with pytest.raises(InvalidInputError, match="same SAEs"):
        generate_batch(handle, [prompt, prompt], [Splice({"s": (SAE_HOOK, sae)}), other], max_new_tokens=2)
    short = _splice(handle, sae, prompt, [SteerEdit(sae="s", feature=3, alpha=1.0)], n_new=0)
    with pytest.raises(InvalidInputError, match="n_total"):
        generate_tokens(handle, prompt, short, max_new_tokens=3)
    with pytest.raises(InvalidInputError, match="one splice per prompt"):
        generate_batch(handle, [prompt], [short, short], max_new_tokens=1)
