"""The eval layer of `scr_tpp`; its other layers: `sae_atlas.geometry.scr_tpp` (maths).

`scr` and `tpp`: does ablating the few SAE latents tied to a concept remove just that
concept from the model's activations?

SAEBench's `scr_and_tpp` (Karvonen et al. 2025) on built-in sets (no hub): texts are
mean-pooled over their tokens (`saes.eval.sparse_probing.pooled_activations`), each
label group split into training and held-out rows (`geometry.splits.stratified_split`),
probes fitted on the pooled residual and scored held out; `geometry.scr_tpp` has the
arithmetic.

- `scr` (spurious correlation removal) on `profession_gender`: template sentences about a
  professor or a nurse, each named and referred to as a man or a woman. A probe trained
  only on male professors vs female nurses is biased toward gender; ablating the top-N
  gender latents should restore its profession accuracy (`scr_metric_threshold_{N}`, and
  both directions as `scr_dir1/2_threshold_{N}`), category `scr_metrics`.
- `tpp` (targeted probe perturbation) on `saes.eval.probe_data`'s `topics`: per topic, ablate
  the top-N latents of its one-vs-rest probe; its accuracy should drop and the other
  topics' should not (`tpp_threshold_{N}_total_metric`, `_intended_diff_only`,
  `_unintended_diff_only`), category `tpp_metrics`; per-topic scores are unstructured.

N runs over `n_values` (fewer latents are ablated when fewer have a nonzero effect, e.g.
past the SAE's width; the metric keeps the requested N in its name).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.scr_tpp import BinaryTask, Pooled, scr_metrics, tpp_metrics
from sae_atlas.geometry.splits import stratified_split
from sae_atlas.saes.eval.probe_data import topics_set
from sae_atlas.saes.eval.sparse_probing import binary_tasks, pooled_activations
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec

SCR_DATASET = "profession_gender"
MALE_NAMES = ("James", "John", "Robert", "Michael", "David", "William", "Richard", "Thomas", "Daniel", "Paul")
FEMALE_NAMES = ("Mary", "Patricia", "Linda", "Susan", "Sarah", "Karen", "Nancy", "Lisa", "Emily", "Anna")
PRONOUNS = {True: ("He", "his"), False: ("She", "her")}  # by male
PROFESSION_TEMPLATES = {  # by professor
    True: ("{name} is a professor of {topic}. {He} lectures at the university and grades {his} students' essays.",
           "Professor {name} published a new paper on {topic}; {he} presented it at a conference.",
           "{name} teaches {topic} to graduate students, and {his} seminar is always full."),
    False: ("{name} is a nurse on the {topic}. {He} checks on {his} patients every hour.",
            "Nurse {name} works night shifts on the {topic}; {he} gives the patients their medicine.",
            "{name} cares for the sick on the {topic}, and {his} patients trust {him}."),
}
TOPICS = {True: ("physics", "history", "chemistry", "economics", "philosophy", "linguistics"),
          False: ("children's ward", "surgical ward", "emergency ward", "cardiac ward", "maternity ward",
                  "intensive care ward")}


@dataclass(frozen=True)
class ScrTppConfig:
    """The numbers of latents to ablate, texts per label group (SCR: per profession and
    gender; TPP: per topic), tokens per text, the held-out share and the seed."""

    n_values: tuple[int, ...] = (2, 5, 10, 20, 50, 100, 500)
    per_group: int = 32
    max_tokens: int = 64
    test_frac: float = 0.25
    seed: int = 0


def profession_gender_texts(per_group: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """`(texts, professor, male)`: up to `per_group` seeded template sentences for each
    profession x gender."""
    rng = random.Random(seed)
    texts: list[str] = []
    professor: list[bool] = []
    male: list[bool] = []
    for is_professor in (True, False):
        for is_male in (True, False):
            he, his = PRONOUNS[is_male]
            sentences = [template.format(name=name, topic=topic, He=he, he=he.lower(), his=his,
                                         him="him" if is_male else "her")
                         for template in PROFESSION_TEMPLATES[is_professor]
                         for name in (MALE_NAMES if is_male else FEMALE_NAMES) for topic in TOPICS[is_professor]]
            rng.shuffle(sentences)
            texts += sentences[:per_group]
            professor += [is_professor] * len(sentences[:per_group])
            male += [is_male] * len(sentences[:per_group])
    return texts, np.array(professor), np.array(male)


def pooled(inputs: EvalInputs, texts: list[str], config: ScrTppConfig) -> tuple[Pooled, np.ndarray]:
    """The texts' pooled activations and codes at the SAE's hook, and its decoder `[F, d]`."""
    if config.per_group < 3:
        raise InvalidInputError(f"per_group must be at least 3 (2 training and 1 held-out text), got {config.per_group}")
    handle, hook = inputs.checked_model()
    acts, codes = pooled_activations(handle, inputs.sae, hook, texts, max_tokens=config.max_tokens)
    return Pooled(acts, codes), inputs.sae.W_dec.detach().float().cpu().numpy()


def run_scr(inputs: EvalInputs, config: ScrTppConfig) -> EvalOutcome:
    """Spurious correlation removal on the profession x gender sentences."""
    texts, professor, male = profession_gender_texts(config.per_group, config.seed)
    data, W_dec = pooled(inputs, texts, config)
    groups = np.array([f"{p}/{m}" for p, m in zip(professor, male, strict=True)])
    train, test = stratified_split(groups, config.test_frac, np.random.default_rng(config.seed))
    metrics, accuracies = scr_metrics(data.rows(train), data.rows(test), professor[train], male[train],
                                      professor[test], male[test], W_dec, config.n_values, config.seed)
    return EvalOutcome({"scr_metrics": metrics}, [{"dataset_name": SCR_DATASET, **metrics}],
                       {SCR_DATASET: accuracies})


def one_vs_rest(labels: np.ndarray, seed: int) -> dict[str, BinaryTask]:
    """The balanced one-vs-rest task of every class (`binary_tasks`)."""
    return {cls: BinaryTask(rows, y) for cls, rows, y in binary_tasks(labels.tolist(), seed)}


def run_tpp(inputs: EvalInputs, config: ScrTppConfig) -> EvalOutcome:
    """Targeted probe perturbation on the built-in topic sentences."""
    topics = topics_set(config.per_group, config.seed)
    data, W_dec = pooled(inputs, topics.texts, config)
    labels = np.asarray(topics.labels)
    train, test = stratified_split(labels, config.test_frac, np.random.default_rng(config.seed))
    overall, per_class = tpp_metrics(data.rows(train), data.rows(test), one_vs_rest(labels[train], config.seed),
                                     one_vs_rest(labels[test], config.seed), W_dec, config.n_values, config.seed)
    return EvalOutcome({"tpp_metrics": overall}, [{"dataset_name": topics.name, **overall}],
                       {topics.name: per_class})


SCR: EvalSpec[ScrTppConfig] = EvalSpec("scr", "scr", ScrTppConfig, run_scr)
TPP: EvalSpec[ScrTppConfig] = EvalSpec("tpp", "tpp", ScrTppConfig, run_tpp)
