"""Interventions on the real SmolLM2-135M (slow: loads the model).

The atlas is built in the test the way users build one, kept small: a corpus of the
built-in concept paragraphs (weekdays, months, numbers, categories) with some standard
library docstrings, activations cached at one layer, and a TopK SAE trained on them.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.interventions import AtlasEditSources
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.builtin_text import (
    WEEKDAYS,
    concept_document,
    docstrings_of,
    stdlib_source_files,
)
from sae_atlas.saes.encoding.cached import sae_activation_matrix
from sae_atlas.saes.intervene.concepts import value_token_ids, weekdays
from sae_atlas.saes.intervene.edits import RotateEdit, resolve_positions
from sae_atlas.saes.intervene.splice import build_splice, run_spliced
from sae_atlas.store.activations import ActivationReader

pytestmark = pytest.mark.slow

LAYER = 4
HOOK = f"blocks.{LAYER}.hook_resid_post"
PROMPT = "Today is Monday, so tomorrow is"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import load_model
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    handle = load_model("smollm2-135m")
    root = tmp_path_factory.mktemp("realmodel") / "atlas"
    rng = random.Random(0)
    docs = [concept_document(rng, 12) for _ in range(250)]
    for f in stdlib_source_files()[:30]:
        docs += docstrings_of(f)[:4]
    rng.shuffle(docs)
    corpus = root.parent / "corpus.txt"
    corpus.write_text("\n\n".join(docs))
    cache_activations(handle, root, [HOOK], corpus=CorpusSpec(source=str(corpus), context_size=64),
                      n_tokens=16_000, progress=False)
    trained = train_saes(root, [HOOK], architecture="topk", d_sae=1024, k=16,
                         train_cfg=TrainConfig(total_tokens=64_000, batch_size=512, progress=False))
    sae_id = trained[HOOK]["sae_id"]
    atlas = Atlas(root, model=handle)
    acts, token_ids = sae_activation_matrix(atlas.sae(sae_id).module(), ActivationReader(root, HOOK), split="all")
    return {"atlas": atlas, "sae_id": sae_id, "acts": acts.tocsc(), "token_ids": token_ids, "handle": handle}


def _token(handle, text: str) -> int:
    ids = handle.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _selectivity(built, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per feature: firing rate on the given tokens, and elsewhere."""
    on = np.isin(built["token_ids"], token_ids)
    fires = built["acts"] > 0
    rate_on = np.asarray(fires[on].mean(0)).ravel()
    rate_off = np.asarray(fires[~on].mean(0)).ravel()
    return rate_on, rate_off


def _p(out, token: int) -> float:
    return float(torch.softmax(out.logits_TV[-1].double(), -1)[token])


def test_ablating_weekday_features_hurts_more_than_random_features(built):
    atlas, sid, handle = built["atlas"], built["sae_id"], built["handle"]
    days = [_token(handle, " " + d) for d in WEEKDAYS]
    rate_on, rate_off = _selectivity(built, days)
    clean = atlas.run(PROMPT, sae_ids=[sid])
    monday = [i for i, t in enumerate(clean.tokens) if t.strip() == "Monday"][0]
    active = clean.codes[sid][monday] > 0
    weekday = [int(i) for i in np.argsort(-(rate_on - rate_off))
               if rate_on[i] > 0.3 and rate_on[i] > 5 * rate_off[i] and active[i]][:8]
    assert len(weekday) >= 2, "the SAE learned no weekday features"
    answer = _token(handle, " Tuesday")
    p_clean = _p(clean, answer)

    def drop(features: list[int]) -> float:
        edits = [{"kind": "ablate", "sae": sid, "feature": f} for f in features]
        return p_clean - _p(atlas.run(PROMPT, edits), answer)

    density = np.asarray((built["acts"] > 0).mean(0)).ravel()
    rng = np.random.default_rng(0)
    random_drops = []
    for _ in range(5):
        picked = []
        for f in weekday:  # a random feature of matched density for each weekday feature
            near = [int(i) for i in np.argsort(np.abs(density - density[f]))[:40] if i not in weekday + picked]
            picked.append(int(rng.choice(near)))
        random_drops.append(drop(picked))
    weekday_drop = drop(weekday)
    print(f"P(' Tuesday') {p_clean:.3f}; weekday ablation drop {weekday_drop:.3f}; random {random_drops}")
    assert weekday_drop > 0.05
    assert weekday_drop > max(random_drops)


def test_steering_with_a_friday_feature_raises_p_friday(built):
    """The " Friday" feature (the one firing most selectively on " Friday" tokens), steered
    into the weekday token of a prompt whose answer copies that day, raises P(" Friday")."""
    atlas, sid, handle = built["atlas"], built["sae_id"], built["handle"]
    friday = _token(handle, " Friday")
    rate_on, rate_off = _selectivity(built, [friday])
    feature = int(np.argmax(rate_on - 5 * rate_off))
    assert rate_on[feature] > 0.5
    alpha = float(built["acts"][:, feature].max())
    prompt = "The meeting is on Monday. The meeting is on"
    edit = {"kind": "steer", "sae": sid, "feature": feature, "alpha": alpha, "at": {"match": "Monday"}}
    base, out = atlas.run(prompt), atlas.run(prompt, [edit])
    steered = atlas.steer(prompt, [edit], max_new_tokens=3)
    print(f"Friday feature {feature}: P(' Friday') {_p(base, friday):.4f} -> {_p(out, friday):.4f}; "
          f"{steered.baseline_text!r} -> {steered.edited_text!r}")
    assert _p(out, friday) > 2 * _p(base, friday)
    assert any(r["token_id"] == friday for r in steered.rising[:5])


def test_rotation_on_the_weekday_circle_beats_a_random_plane(built):
    """Rotate the weekday token by k steps on the stored circle planes of layers 2-6 (the
    49 arithmetic prompts, batched) and count how often the answer moves by k."""
    atlas, handle = built["atlas"], built["handle"]
    layers = [2, 3, 4, 5, 6]
    analysis = run_circle_analysis(handle, weekdays(), layers)
    write_concept_run(atlas.root, "weekdays", analysis, model=handle.name)
    batch = analysis.batch
    pos = int(batch.concept_pos[0])
    assert (batch.concept_pos == pos).all() and (batch.lengths == batch.lengths[0]).all()
    cand = torch.tensor(value_token_ids(handle.tokenizer, analysis.concept))
    answers = torch.tensor([p.answer for p in batch.prompts])
    sources = AtlasEditSources(atlas.ctx)
    tokens = [""] * int(batch.lengths[0])
    hits = {"circle": 0, "random_plane": 0}
    for k in (1, 2, 3):
        for baseline in hits:
            specs = [RotateEdit(circle="weekdays", layer=ly, steps=k, baseline=baseline, at=[pos], seed=k)
                     for ly in layers]
            logits = run_spliced(handle, batch.tokens, build_splice(sources, [], specs, tokens)).logits_TV[:, -1]
            top = logits[:, cand].argmax(1)
            hits[baseline] += int((top == (answers + k) % 7).sum())
    n = 3 * len(batch)
    print(f"answer moved by k: circle {hits['circle']}/{n}, random plane {hits['random_plane']}/{n}")
    assert hits["circle"] > hits["random_plane"]


def test_ablating_a_graphs_top_nodes_moves_the_target_more_than_matched_random_features(built):
    """Attribution graph over the atlas's residual SAE for a 14-token prompt: ablating its 5
    most influential feature nodes in the model itself (spliced SAE, norms and attention
    live) moves the target's demeaned logit more than ablating 5 active features of matched
    firing density (both printed). (In the graph's frozen replacement model removing this
    SAE's massive-activation feature at ' the' diverges, as does any large enough edit: refused
    by name.)"""
    from sae_atlas.saes.circuits.adjacency import build_graph
    from sae_atlas.saes.circuits.node_interventions import (
        NodeEdit,
        density_matched,
        influence_ranked,
        intervene,
    )
    from sae_atlas.saes.intervene.edits import AblateEdit, compile_edit
    from sae_atlas.saes.intervene.splice import Splice

    atlas, sid, handle = built["atlas"], built["sae_id"], built["handle"]
    tokens = handle.to_tokens("Let's do some days of the week math. Two days from Monday is")[0]
    assert 10 <= len(tokens) <= 16
    sae = atlas.sae(sid).module()
    graph = build_graph(handle, {sid: sae}, tokens, targets=[" Wednesday"], batch_size=128)
    density = np.asarray((built["acts"] > 0).mean(0)).ravel()
    top = influence_ranked(graph)[:5]
    control = density_matched(graph, top, lambda j: float(density[int(graph.features.latent[j])]), seed=0)
    target = _token(handle, " Wednesday")

    def ablated(nodes: list[int]) -> float:
        edits = []
        for n in nodes:
            pos, latent = int(graph.features.pos[n]), int(graph.features.latent[n])
            mask = resolve_positions([pos], [], len(tokens), len(tokens))
            edits.append(compile_edit(AblateEdit(sae=sid, feature=latent, at=[pos]), mask, sae=sae,
                                      hook=sae.cfg.hook_name))
        logits = run_spliced(handle, tokens, Splice({sid: (sae.cfg.hook_name, sae)}, edits)).logits_TV[-1]
        return float(logits[target] - logits.mean())

    clean = ablated([])
    moved = {"top 5 graph nodes": ablated(top) - clean, "5 density-matched random features": ablated(control) - clean}
    print(f"target ' Wednesday' demeaned logit change: {moved}")
    assert abs(moved["top 5 graph nodes"]) > abs(moved["5 density-matched random features"])
    with pytest.raises(InvalidInputError, match="diverged"):
        intervene(handle, graph, [NodeEdit("clamp", top[:1], value=1e30)])
