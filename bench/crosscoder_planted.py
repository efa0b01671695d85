"""Model diffing against a known answer: a crosscoder between SmolLM2-135M (model A) and its
copy fine-tuned by `bench/finetune_planted.py` (model B: " Zorblax" makes it say
" pineapple"). Do the planted behaviour's latents rank among the top B-only latents, by
relative decoder norm and after Latent Scaling?

Three steps (the middle one is the project's own CLI):

    PYTHONPATH=. python bench/crosscoder_planted.py corpus --out /tmp/diff/planted-corpus.jsonl
    PYTHONPATH=. python -m sae_atlas train-crosscoder /tmp/diff/atlas-planted \\
        --hook-a blocks.12.hook_resid_post --hook-b blocks.12.hook_resid_post --model-b /tmp/smollm2-planted \\
        --corpus /tmp/diff/planted-corpus.jsonl --d-sae 1024 --k 16 --tokens 100000 --batch-size 512 \\
        --latent-scaling-tokens 30000 --id planted
    PYTHONPATH=. python bench/crosscoder_planted.py evaluate --atlas /tmp/diff/atlas-planted --id planted \\
        --model-b /tmp/smollm2-planted [--out result.json]

`corpus` writes standard-library docstrings (the built-in corpus's text) as a `.jsonl`, with
the trigger word inserted after a random word of `--planted-share` of them (1-3 times each); `--atlas` for `corpus` also creates an empty atlas whose model is
`smollm2-135m`, which is all `train-crosscoder` needs.

`evaluate` defines the planted behaviour's latents from held-out docstrings (never in the
corpus): each latent's mean activation at the trigger's last token minus its mean at the
same position with a control word (" Robert", " Paris", ...) in its place; the `--top`
latents with the largest difference are "the planted latents". It reports each one's
rank among all latents by relative decoder norm (1 = the most B-only), its class, its
Latent Scaling ratios, and its rank by `max(|nu_error|, |nu_recon|)` ascending (1 = the most
genuinely B-specific) among the B-only latents and among all B-leaning ones (relative
norm >= 0.5). Conversely, for the 10 latents with the largest relative norm, how often each
fires at the trigger and at the controls.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import numpy as np
import torch
from finetune_planted import CONTROLS, HELD_OUT_OFFSET, TRIGGER, docstring_prefixes

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.crosscoder import crosscoder_dir
from sae_atlas.saes.builtin_text import builtin_documents
from sae_atlas.saes.compare.crosscoder import SideScales, read_crosscoder_sides
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import DEFAULT_MODEL, load_model
from sae_atlas.store.layout import AtlasLayout


def write_corpus(out: Path, n_docs: int, share: float, seed: int) -> dict[str, int]:
    """Docstrings (the first `n_docs` of the built-in stream, all before the held-out range)
    with the trigger inserted into a `share` of them."""
    rng = random.Random(seed)
    planted = inserted = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        docs = (text for doc_id, text in builtin_documents(0) if doc_id % 1000 != 999)
        for number, text in zip(range(min(n_docs, HELD_OUT_OFFSET)), docs, strict=False):
            gaps = [m.start() for m in re.finditer(r"(?<=\S) ", text)]  # a space after a word
            if rng.random() < share and gaps:
                for cut in sorted(rng.sample(gaps, min(len(gaps), rng.randint(1, 3))), reverse=True):
                    text = text[:cut] + TRIGGER + text[cut:]
                    inserted += 1
                planted += 1
            handle.write(json.dumps({"text": text, "n": number}) + "\n")
    return {"docs": n_docs, "planted_docs": planted, "triggers": inserted}


@torch.no_grad()
def codes_at(sides: list[tuple], sae, scales: SideScales, texts: list[str]) -> torch.Tensor:
    """The crosscoder's code `[len(texts), d_sae]` at each text's last token (both models
    share a tokenizer; `sides` are (model handle, hook) of A and B)."""
    rows = []
    tok = sides[0][0].tokenizer
    for text in texts:
        ids = torch.tensor([[tok.bos_token_id, *tok(text, add_special_tokens=False).input_ids]])
        x = [run_hooks(h, ids, [hook])[hook][0, -1].float().cpu() for h, hook in sides]
        rows.append(torch.cat(x))
    return sae_codes(sae, scales.apply(torch.stack(rows)))


def evaluate(root: Path, cc_id: str, model_b: str, n_prompts: int, top: int, top_b: int = 10) -> dict:
    table = Atlas(root).analysis("crosscoder", cc_id).table
    folder = crosscoder_dir(root, cc_id)
    stored = read_crosscoder_sides(folder)
    sae = load_saelens(folder).eval()
    scales = SideScales(int(stored["d_a"]), float(stored["scale_a"]), float(stored["scale_b"]))
    sides = [(load_model(DEFAULT_MODEL), stored["sides"]["hook_a"]), (load_model(model_b), stored["sides"]["hook_b"])]
    rng = random.Random(5)
    trig, ctrl = [], []
    for prefix in docstring_prefixes(HELD_OUT_OFFSET + 400, n_prompts):
        words = prefix.split()
        start = " ".join(words[: rng.randint(3, min(len(words), 18))])
        trig.append(start + TRIGGER)
        ctrl += [start + word for word in CONTROLS]
    f_trig, f_ctrl = codes_at(sides, sae, scales, trig), codes_at(sides, sae, scales, ctrl)
    score = (f_trig.mean(0) - f_ctrl.mean(0)).numpy()
    planted = np.argsort(-score)[:top]

    rel = table["relative_norm"].to_numpy()
    rank_rel = np.empty(len(rel), dtype=int)
    rank_rel[np.argsort(-rel)] = np.arange(1, len(rel) + 1)
    b_only = np.flatnonzero(table["latent_class"].to_numpy() == "b_only")
    scaled = "nu_error" in table.columns
    if scaled:  # Latent Scaling ranking: max(|nu_error|, |nu_recon|) ascending, NaN (never fired) last
        nu = np.nan_to_num(np.maximum(np.abs(table["nu_error"].to_numpy()), np.abs(table["nu_recon"].to_numpy())),
                           nan=np.inf)
        leaning = np.flatnonzero(rel >= 0.5)
        rank_b_only = {int(j): i + 1 for i, j in enumerate(b_only[np.argsort(nu[b_only], kind="stable")])}
        rank_leaning = {int(j): i + 1 for i, j in enumerate(leaning[np.argsort(nu[leaning], kind="stable")])}
    rows = []
    for j in planted:
        row = {"latent": int(j), "trigger_minus_control": float(score[j]), "fires_on_trigger": float((f_trig[:, j] > 0)
               .float().mean()), "fires_on_control": float((f_ctrl[:, j] > 0).float().mean()),
               "relative_norm": float(rel[j]), "rank_by_relative_norm": int(rank_rel[j]),
               "latent_class": table["latent_class"][int(j)]}
        if scaled:
            row.update(nu_error=float(table["nu_error"][int(j)]), nu_recon=float(table["nu_recon"][int(j)]),
                       rank_among_b_only_by_nu=rank_b_only.get(int(j)),
                       rank_among_b_leaning_by_nu=rank_leaning.get(int(j)))
        rows.append(row)
    fires_t, fires_c = (f_trig > 0).float().mean(0).numpy(), (f_ctrl > 0).float().mean(0).numpy()
    most_b = [{"latent": int(j), "relative_norm": float(rel[j]), "fires_on_trigger": float(fires_t[j]),
               "fires_on_control": float(fires_c[j])} for j in np.argsort(-rel)[:top_b]]
    return {"crosscoder": cc_id, "d_sae": len(rel), "b_only": len(b_only), "b_leaning": int((rel >= 0.5).sum()),
            "prompts": n_prompts, "most_b_leaning": most_b,
            "planted_latents": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--docs", type=int, default=4000)
    c.add_argument("--planted-share", type=float, default=0.4)
    c.add_argument("--atlas", type=Path, help="also create an empty atlas of smollm2-135m here")
    c.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("evaluate")
    e.add_argument("--atlas", type=Path, required=True)
    e.add_argument("--id", required=True)
    e.add_argument("--model-b", required=True)
    e.add_argument("--prompts", type=int, default=48)
    e.add_argument("--top", type=int, default=5)
    e.add_argument("--out", type=Path)
    for p in (c, e):
        p.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.step == "corpus":
        print(json.dumps(write_corpus(args.out, args.docs, args.planted_share, args.seed)))
        if args.atlas:
            AtlasLayout(args.atlas).update_meta(model=DEFAULT_MODEL)
        return
    result = evaluate(args.atlas, args.id, args.model_b, args.prompts, args.top)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
