"""The eval layer of `absorption`; its other layers: `sae_atlas.geometry.absorption` (maths).

`absorption`: feature absorption and feature splitting on the first-letter task.

SAEBench's `absorption_first_letter` eval (Chanin et al. 2024, "A is for Absorption"). The
words are the model's own alphabetic vocabulary: every single token that is a word of
ASCII letters, with or without one leading space, as the tokenizer writes it. The words are
split (seeded, `test_frac` held out) and each word gets one in-context prompt: up to
`max_icl_examples` other words of its own split, each as the template followed by its
answer (" " + the capitalised first letter), one per line, then the template with the word.
The activation at the SAE's hook is read at the word's token: the read position counts the
template's tokens after the word, as this tokenizer splits them, back from the prompt's end
(a word whose token is not found there is left out and counted; the probes' split is then
drawn over the words kept). Per letter,
`geometry.absorption.letter_absorption` fits the logistic probe (true direction), the
L1-ranked k-sparse probes on the codes (k = 1..`max_k_value`, split latents) and scores
absorption on the held-out probe true positives; `absorption_scores` averages the letters
whose probe F1 exceeds `min_GT_probe_f1`, or, with fewer than `min_feats_for_eval` of
them, writes no scores (metrics None) and says why in the unstructured results.

Unlike SAEBench, one prompt per word serves both the probes and the absorption scores.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.absorption import AbsorptionThresholds, absorption_scores, letter_absorption
from sae_atlas.geometry.probes import train_test_split
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.encoding.texts import tokenize_texts
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE

LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class AbsorptionConfig:
    """SAEBench's settings: prompt template, ICL examples per prompt, held-out share of the
    words, largest k and F1 jump for splits, L1 strength of the latent ranking, the probe F1
    a letter needs and how many letters must have it; `max_words` (0: all) caps the
    vocabulary by a seeded sample (SAEBench reads all of it; a 1000-word default keeps the
    eval within minutes on a CPU: one ~90-token prompt per word); batch size and seed."""

    prompt_template: str = "{word} has the first letter:"
    max_icl_examples: int = 10
    test_frac: float = 0.2
    max_k_value: int = 10
    f1_jump_threshold: float = 0.03
    k_sparse_probe_l1_decay: float = 0.01
    min_GT_probe_f1: float = 0.6  # noqa: N815 (SAEBench's config name)
    min_feats_for_eval: int = 20
    max_words: int = 1000
    batch_size: int = 32
    random_seed: int = 42


def alphabetic_words(tokenizer: Any) -> list[tuple[str, int]]:
    """`(word, token id)` of every token that reads as ASCII letters, with or without one
    leading space, in token-id order."""
    words = []
    for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        word = tokenizer.convert_tokens_to_string([token])
        letters = word[1:] if word.startswith(" ") else word
        if letters and all(char in string.ascii_letters for char in letters):
            words.append((word, int(token_id)))
    return words


def icl_prompt(word: str, examples: list[str], template: str) -> str:
    """The word's prompt: each example as template + answer on its own line, then the word's
    template."""
    lines = [template.format(word=example) + " " + example.strip()[0].upper() for example in examples]
    return "\n".join([*lines, template.format(word=word)])


def split_prompts(words: list[str], config: AbsorptionConfig) -> list[str]:
    """One prompt per word, its ICL examples drawn (seeded) from its own split, never itself."""
    train, test = train_test_split(len(words), config.test_frac, config.random_seed)
    rng = np.random.default_rng(config.random_seed)
    prompts = [""] * len(words)
    for rows in (train, test):
        for row in rows:
            others = rows[rows != row]
            chosen = rng.choice(others, size=min(config.max_icl_examples, len(others)), replace=False)
            prompts[row] = icl_prompt(words[row], [words[i] for i in chosen], config.prompt_template)
    return prompts


@torch.no_grad()
def word_activations(handle: ModelHandle, sae: SAE, hook: str, prompts: list[str], token_ids: list[int],
                     config: AbsorptionConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(activations [N, d], codes [N, d_sae], found [N])` at each prompt's word token, read
    `1 + len(template suffix tokens)` from the end; rows where that token is not the word's
    are zero and not `found`."""
    suffix = config.prompt_template.split("{word}", 1)[1]
    after = len(handle.to_tokens(suffix, prepend_bos=False)[0]) if suffix else 0
    tokens, lengths = tokenize_texts(handle, prompts)
    positions = lengths - 1 - after
    found = tokens[torch.arange(len(prompts)), positions.clamp(min=0)] == torch.tensor(token_ids)
    found &= positions >= 1
    acts, codes = [], []
    for start in range(0, len(prompts), config.batch_size):
        rows = torch.arange(start, min(start + config.batch_size, len(prompts)))
        width = int(lengths[rows].max())
        x = run_hooks(handle, tokens[rows, :width], [hook])[hook][torch.arange(len(rows)), positions[rows].clamp(min=0)]
        acts.append(x.float().cpu().numpy())
        codes.append(sae_codes(sae, x).float().cpu().numpy())
    return np.concatenate(acts), np.concatenate(codes), found.numpy()


def thresholds_of(config: AbsorptionConfig) -> AbsorptionThresholds:
    """SAEBench's fixed absorption thresholds with the config's split and letter gates."""
    return AbsorptionThresholds(f1_jump=config.f1_jump_threshold, min_probe_f1=config.min_GT_probe_f1,
                                min_letters=config.min_feats_for_eval)


def probeable(y: np.ndarray, config: AbsorptionConfig) -> bool:
    """Whether both the training and the held-out rows hold positives and negatives."""
    train, test = train_test_split(len(y), config.test_frac, config.random_seed)
    return all(0 < y[rows].sum() < len(rows) for rows in (train, test))


def run_absorption(inputs: EvalInputs, config: AbsorptionConfig) -> EvalOutcome:
    """Prompt the model with every alphabetic word, probe each first letter and score."""
    if config.min_feats_for_eval < 2:
        raise InvalidInputError("min_feats_for_eval must be at least 2 (the scores include a standard deviation)")
    handle, hook = inputs.checked_model()
    vocabulary = alphabetic_words(handle.tokenizer)
    if config.max_words and len(vocabulary) > config.max_words:
        keep = np.sort(np.random.default_rng(config.random_seed).choice(len(vocabulary), config.max_words,
                                                                         replace=False))
        vocabulary = [vocabulary[i] for i in keep]
    if len(vocabulary) < 4:
        raise InvalidInputError(f"{handle.name}'s tokenizer has {len(vocabulary)} alphabetic single-token words; "
                                "the absorption eval needs at least 4")
    words = [word for word, _ in vocabulary]
    acts, codes, found = word_activations(handle, inputs.sae, hook, split_prompts(words, config),
                                          [token_id for _, token_id in vocabulary], config)
    if found.sum() < 4:
        raise InvalidInputError(f"the word token is at the template's read position in only {int(found.sum())} "
                                f"of {len(words)} prompts; check the prompt template for this tokenizer")
    acts, codes = acts[found], codes[found]
    first = np.array([LETTERS.index(word.strip()[0].lower()) for word, kept in zip(words, found, strict=True) if kept])
    decoder = inputs.sae.W_dec.detach().float().cpu().numpy()
    thresholds = thresholds_of(config)
    letters = [letter_absorption(letter, acts, codes, decoder, first == i, max_k=config.max_k_value,
                                 l1_decay=config.k_sparse_probe_l1_decay, test_frac=config.test_frac,
                                 seed=config.random_seed, thresholds=thresholds)
               for i, letter in enumerate(LETTERS) if probeable(first == i, config)]
    scores = absorption_scores(letters, thresholds)
    unstructured: dict[str, Any] = {
        "words": len(words), "words_without_read_token": int((~found).sum()),
        "probe_f1": {result.letter: result.probe_f1 for result in letters},
        "split_latents": {result.letter: result.split_latents for result in letters},
    }
    if scores.refusal is not None:
        unstructured["not_scored"] = scores.refusal
    return EvalOutcome({"mean": scores.metrics}, scores.details, unstructured)


ABSORPTION: EvalSpec[AbsorptionConfig] = EvalSpec("absorption", "absorption_first_letter", AbsorptionConfig,
                                                  run_absorption)
