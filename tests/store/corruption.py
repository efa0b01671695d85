"""The corruption battery: damage one file of the small test atlas, run every read path,
and classify each answer.

Every kind of atlas file is flipped (one byte inverted in the middle), truncated (to half
its size) or deleted on a fresh copy of the atlas. Each read path (`PROBES`: the Atlas
facade, the activation reader, training's resume check, `index --rebuild`, and the HTTP
app) then answers; its outcome is

- `same`: the answer equals the one from the undamaged atlas;
- `refused`: an `AtlasError` (or an HTTP error body) that names the damaged file and says
  how to repair it;
- `reported`: an answer that differs only by reporting the damage (names the file and the
  repair), e.g. `/saes` listing the damaged SAE as such;
- `follows` (foreign cases only): a different answer from a probe that reads nothing but
  the copied files, which are intact and belong together, so it answers for them (text
  search encodes with whatever weights the SAE now has);
- `unclear`: an error that names another file or no repair;
- `crash`: an exception that is not the project's own;
- `silent`: a different answer that does not mention the damage.

Only the first three are acceptable. A second set of cases (`FOREIGN`) leaves every file
intact and consistent with its sidecar but copies a group of the healthy SAE's files over
the damaged SAE's (its summary tables, its map, ..., or its weights with their cfg.json):
the damaged SAE's files then no longer belong together, and a refusal must name one of its
files derived from other weights. Three further groups damage the same way: every eval
result kind of the damaged SAE (`evals/<eval>.json` and its sidecar; the read paths that
open eval results run), the folder of a circuit-tracer CLT imported into an atlas of its
own (`CLT_FILES`, with the reads of a CLT), and the inputs of `sae-atlas register` (the
files of an SAE folder or analysis run that its registry no longer lists; the register call
must refuse naming the file or record exactly what was recorded before).
`python -m tests.store.corruption` runs the battery and writes the tables into
RELIABILITY.md.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sae_atlas.errors import AtlasError
from sae_atlas.saes.eval.spec import EVAL_NAMES
from sae_atlas.store.tables import load_occurrence
from tests.api.small_atlas import HOOKS, PLANTED_KIND, PLANTED_RUN, build_small_atlas

SAE0, SAE1 = (f"{hook}-topk-64" for hook in HOOKS)
ACCEPTABLE = ("same", "refused", "reported", "follows")
DAMAGES = ("flip", "truncate", "delete")
TEXT = "the cat sat on the mat"
FEATURE = 4  # a latent with examples in both SAEs of the small atlas
TABLE_START = "<!-- corruption-table:start -->"
TABLE_END = "<!-- corruption-table:end -->"

# file kind -> its path in the atlas; the second SAE (layer 1) and the first hook are damaged,
# so the first SAE's pages show what a damaged neighbour does to them
FILES: dict[str, str] = {
    "atlas.json": "atlas.json",
    "activations manifest.json": f"activations/{HOOKS[0]}/manifest.json",
    "activation shard": f"activations/{HOOKS[0]}/shard-00003.safetensors",
    "cfg.json": f"saes/{SAE1}/cfg.json",
    "sae_weights.safetensors": f"saes/{SAE1}/sae_weights.safetensors",
    "sparsity.safetensors": f"saes/{SAE1}/sparsity.safetensors",
    "training.json": f"saes/{SAE1}/training.json",
    "eval.json": f"saes/{SAE1}/eval.json",
    "features.parquet": f"saes/{SAE1}/features.parquet",
    "examples.parquet": f"saes/{SAE1}/examples.parquet",
    "tables.json": f"saes/{SAE1}/tables.json",
    "occurrence.npz": f"saes/{SAE1}/occurrence.npz",
    "index.faiss": f"saes/{SAE1}/index.faiss",
    "index.json": f"saes/{SAE1}/index.json",
    "map.parquet": f"saes/{SAE1}/map.parquet",
    "map.json": f"saes/{SAE1}/map.json",
    "model.faiss": "indexes/model.faiss",
    "model.json": "indexes/model.json",
    "analysis .json": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.json",
    "analysis .parquet": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.parquet",
    "analysis .png": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.png",
}


@dataclass(frozen=True)
class Foreign:
    """Files of the healthy SAE copied over the damaged SAE's (each intact and consistent with
    its sidecar), the damaged SAE's files a refusal may name (those derived from other
    weights than its own), and the probes that read only the copied files (their answers
    follow them)."""

    copied: tuple[str, ...]
    stale: tuple[str, ...]
    follows: tuple[str, ...] = ()


TABLE_FILES = ("features.parquet", "examples.parquet", "tables.json", "occurrence.npz")
MAP_FILES = ("map.parquet", "map.json")
LABEL_FILES = ("labels.parquet", "labels.json")
INDEX_FILES = ("index.faiss", "index.json")
FOREIGN: dict[str, Foreign] = {
    "summary tables": Foreign(TABLE_FILES, TABLE_FILES),
    "map": Foreign(MAP_FILES, MAP_FILES),
    "labels": Foreign(LABEL_FILES, LABEL_FILES),
    "index": Foreign(INDEX_FILES, INDEX_FILES),
    "weights and cfg.json": Foreign(("sae_weights.safetensors", "cfg.json"),
                                    TABLE_FILES + MAP_FILES + LABEL_FILES + INDEX_FILES
                                    + tuple(f"evals/{name}.json" for name in EVAL_NAMES), ("search_text",)),
}


EVAL_FILES: dict[str, str] = {f"{name} {part}": f"saes/{SAE1}/evals/{name}{suffix}" for name in EVAL_NAMES
                              for part, suffix in (("result", ".json"), ("sidecar", ".sha256.json"))}
EVAL_READERS = ("saes", "board", "eval_result", "http")  # the read paths that open eval results
CLT_ID = "clt"
CLT_FILES: dict[str, str] = {name: f"clts/{CLT_ID}/{name}"
                             for name in ("cfg.json", "clt_weights.safetensors", "source.json", "eval.json")}
REGISTER_FILES: dict[str, str] = {
    "SAE cfg.json": f"saes/{SAE1}/cfg.json",
    "SAE sae_weights.safetensors": f"saes/{SAE1}/sae_weights.safetensors",
    "SAE training.json": f"saes/{SAE1}/training.json",
    "run .json": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.json",
    "run .parquet": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.parquet",
    "run .png": f"analyses/{PLANTED_KIND}/{PLANTED_RUN}.png",
}


def build_battery_atlas(root: Path) -> Path:
    """The small test atlas plus an eval.json per SAE (activation metrics only) and a result
    of every eval of the suite for the damaged SAE."""
    from sae_atlas.saes.eval.evaluate import evaluate_atlas_sae

    build_small_atlas(root)
    for sae_id in (SAE0, SAE1):
        evaluate_atlas_sae(root, sae_id, n_tokens=512, with_model=False)
    _evaluate(root)
    return root


def _evaluate(root: Path) -> None:
    """Every eval of the suite on the damaged SAE, on small settings (the ground truth: the
    healthy SAE's decoder, in a file beside the atlas)."""
    from safetensors.torch import save_file

    from sae_atlas.saes.atlas_saes import load_atlas_sae
    from sae_atlas.saes.eval.absorption import AbsorptionConfig
    from sae_atlas.saes.eval.core import CoreConfig
    from sae_atlas.saes.eval.ground_truth import ground_truth_config
    from sae_atlas.saes.eval.mdl import MdlConfig
    from sae_atlas.saes.eval.meta import MetaConfig
    from sae_atlas.saes.eval.scr_tpp import ScrTppConfig
    from sae_atlas.saes.eval.sparse_probing import SparseProbingConfig
    from sae_atlas.saes.eval.suite import run_suite
    from sae_atlas.saes.models import tiny_model

    truth = root.parent / "truth.safetensors"
    save_file({"W_dec": load_atlas_sae(root, SAE0).W_dec.detach().contiguous()}, str(truth))
    small = ScrTppConfig(per_group=8, max_tokens=24)
    configs = {"core": CoreConfig(n_tokens=256, with_model=False), "mdl": MdlConfig(n_tokens=256),
               "meta": MetaConfig(train_steps=20, train_batch_size=32), "ground_truth": ground_truth_config(truth),
               "sparse_probing": SparseProbingConfig(per_class=8, max_tokens=24, k_values=(1, 2)),
               "absorption": AbsorptionConfig(max_k_value=3), "scr": small, "tpp": small}
    handle = tiny_model(n_layers=2, d_model=32)
    done = run_suite(root, [SAE1], EVAL_NAMES, configs, device="cpu", model=lambda: handle, progress=False)
    assert not done.failures, done.failures


def damage(path: Path, kind: str) -> None:
    """Flip (invert one byte in the middle), truncate (to half) or delete `path`."""
    if kind == "delete":
        path.unlink()
        return
    data = bytearray(path.read_bytes())
    if kind == "flip":
        data[len(data) // 2] ^= 0xFF
    elif kind == "truncate":
        data = data[: len(data) // 2]
    else:
        raise ValueError(kind)
    path.write_bytes(bytes(data))


def copy_foreign(root: Path, names: tuple[str, ...]) -> None:
    """Copy the healthy SAE's files `names` over the damaged SAE's."""
    for name in names:
        shutil.copyfile(root / "saes" / SAE0 / name, root / "saes" / SAE1 / name)


# probes ---------------------------------------------------------------------------------
def _atlas(root: Path) -> Any:
    from sae_atlas.api.atlas import Atlas

    return Atlas(root)


def _feature(sae_id: str) -> Callable[[Path], Any]:
    return lambda root: _atlas(root).feature(sae_id, FEATURE).to_dict()


def _vector(root: Path) -> Any:
    direction = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
    return _atlas(root).search_vector(direction, k=5).to_dicts()


def _token(root: Path) -> Any:
    return _atlas(root).search_token(TOKEN_ID, k=5).to_dict()


def _analysis(root: Path) -> Any:
    atlas = _atlas(root)
    result = atlas.analysis(PLANTED_KIND, PLANTED_RUN).to_dict()
    return {"runs": atlas.analyses().to_dicts(), "run": result,
            "figure": atlas.figure_path(PLANTED_KIND, f"{PLANTED_RUN}.png").read_bytes().hex()}


def _activations(root: Path) -> Any:
    from sae_atlas.store.activations import ActivationReader

    reader = ActivationReader(root, HOOKS[0])
    return [float(b.acts.double().sum()) for b in reader.blocks("heldout")]


def _train(root: Path) -> Any:
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    return train_saes(root, HOOKS, architecture="topk", d_sae=64, k=4,
                      train_cfg=TrainConfig(total_tokens=256 * 20, batch_size=256, progress=False))


def _rebuild(root: Path) -> Any:
    from sae_atlas.store.index import build_atlas_indexes

    infos = build_atlas_indexes(root, rebuild=True)
    return [(i.get("sae_id", "model"), i["type"], i["n"], i["weights_sha256"]) for i in infos]


HTTP_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/saes", None),
    ("GET", f"/saes/{SAE0}/features/{FEATURE}", None),
    ("GET", f"/saes/{SAE1}/features/{FEATURE}", None),
    ("GET", f"/saes/{SAE0}/features/{FEATURE}/flow", None),
    ("GET", f"/saes/{SAE1}/features/{FEATURE}/similar?k=5", None),
    ("GET", f"/saes/{SAE1}/map", None),
    ("POST", "/search/vector", {"vector": np.linspace(-1.0, 1.0, 32).tolist(), "k": 5}),
    ("GET", "/analyses", None),
    ("GET", f"/analyses/{PLANTED_KIND}/{PLANTED_RUN}", None),
    ("GET", "/board", None),
    *(("GET", f"/saes/{SAE1}/evals/{name}", None) for name in EVAL_NAMES),
]
TOKEN_ID = 0  # replaced by a token id of the atlas' examples when the battery starts


def _http(root: Path) -> Any:
    """(status, body) of each request, or the error that stops the app from starting."""
    from starlette.testclient import TestClient

    from sae_atlas.api.http import ServerSettings, create_app

    answers = []
    with TestClient(create_app(ServerSettings(root=root)), raise_server_exceptions=False) as client:
        for method, url, body in [*HTTP_REQUESTS, ("GET", f"/search/token/{TOKEN_ID}", None)]:
            response = client.request(method, url, json=body)
            try:
                payload = response.json()
            except ValueError:
                payload = response.text
            answers.append((url, response.status_code, payload))
    return answers


PROBES: dict[str, Callable[[Path], Any]] = {
    "saes": lambda root: _atlas(root).saes().to_dicts(),
    "feature (healthy SAE)": _feature(SAE0),
    "feature (damaged SAE)": _feature(SAE1),
    "examples": lambda root: _atlas(root).examples(SAE1, FEATURE).to_dicts(),
    "similar": lambda root: _atlas(root).similar(SAE1, FEATURE, k=5).to_dicts(),
    "flow": lambda root: _atlas(root).flow(SAE0, FEATURE).to_dicts(),
    "search_vector": _vector,
    "search_text": lambda root: _atlas(root).search_text(TEXT, k=3).to_dict(),
    "search_token": _token,
    "map": lambda root: _atlas(root).map(SAE1).to_dicts(),
    "occurrence": lambda root: [m.sum() for m in load_occurrence(root, SAE1)],
    "analyses": _analysis,
    "board": lambda root: _atlas(root).board().frame.to_dicts(),
    "eval_result": lambda root: {name: _atlas(root).eval_result(SAE1, name) for name in EVAL_NAMES},
    "activations": _activations,
    "http": _http,
    "train (resume check)": _train,
    "index --rebuild": _rebuild,
}
WRITERS = ("train (resume check)", "index --rebuild")  # each runs on its own damaged copy
READERS = tuple(name for name in PROBES if name not in WRITERS)
"""The probes of the foreign cases: the writers rebuild from whatever weights are there,
so new weights (the foreign weights case) legitimately change their answers."""


# classification -------------------------------------------------------------------------
def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _names(text: str, damaged: tuple[str, ...]) -> bool:
    """Whether an error text names one of the damaged files and a repair."""
    lowered = text.lower()
    return (any(name in text for name in damaged)
            and ("repair" in lowered or "sae-atlas " in lowered or "re-run" in lowered))


def _compare(value: Any, baseline: Any, damaged: tuple[str, ...]) -> str:
    if _canonical(value) == _canonical(baseline):
        return "same"
    return "reported" if _names(_canonical(value), damaged) else "silent"


def _http_outcome(answers: list[Any], baseline: list[Any], damaged: tuple[str, ...]) -> str:
    outcomes = []
    for (_, status, body), (_, base_status, base_body) in zip(answers, baseline, strict=True):
        if status == base_status and _canonical(body) == _canonical(base_body):
            outcomes.append("same")
        elif status >= 400:
            outcomes.append("refused" if _names(_canonical(body), damaged) else "unclear")
        else:
            outcomes.append(_compare(body, base_body, damaged))
    return worst(outcomes)


def worst(outcomes: list[str]) -> str:
    """The least acceptable of several outcomes."""
    order = ("crash", "silent", "unclear", "refused", "reported", "follows", "same")
    return min(outcomes, key=order.index) if outcomes else "same"


def run_probe(name: str, root: Path, baseline: Any, damaged: tuple[str, ...],
              probes: dict[str, Callable[[Path], Any]] | None = None) -> tuple[str, str]:
    """`(outcome, detail)` of one probe (of `PROBES`, or of `probes`) on a damaged atlas;
    `damaged` are the names (or atlas-relative paths) of the files an error or report may name."""
    try:
        value = (probes or PROBES)[name](root)
    except AtlasError as exc:
        return ("refused" if _names(str(exc), damaged) else "unclear"), f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - anything else is a finding, reported as such
        return "crash", f"{type(exc).__name__}: {exc}"
    if name == "http":
        return _http_outcome(value, baseline, damaged), _canonical(value)[:2000]
    return _compare(value, baseline, damaged), _canonical(value)[:2000]


def baselines(root: Path) -> dict[str, Any]:
    """Every probe's answer on the undamaged atlas (which it must not change)."""
    global TOKEN_ID
    TOKEN_ID = int(_atlas(root).examples(SAE1, FEATURE)["token_id"][0])
    return {name: probe(root) for name, probe in PROBES.items()}


def _run_probes(source: Path, work: Path, harm: Callable[[Path], None], damaged: tuple[str, ...],
                probes: tuple[str, ...], base: dict[str, Any],
                functions: dict[str, Callable[[Path], Any]] | None = None) -> dict[str, tuple[str, str]]:
    """Copy the atlas to `work`, `harm` the copy, and run `probes` on it (each probe that
    writes, which may repair the damage, on a copy of its own)."""
    results = {}
    for name in probes:
        copy = work if name not in WRITERS else work.with_name(f"{work.name}-{WRITERS.index(name)}")
        if not copy.exists():
            shutil.copytree(source, copy)
            harm(copy)
        results[name] = run_probe(name, copy, base[name], damaged, functions)
    return results


def run_case(source: Path, work: Path, kind: str, how: str, base: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every probe on a copy of the atlas with file `kind` damaged `how`."""
    return _run_probes(source, work, lambda copy: damage(copy / FILES[kind], how), (Path(FILES[kind]).name,),
                       tuple(PROBES), base)


def run_foreign(source: Path, work: Path, case: str, base: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every read probe on a copy of the atlas with the files of `FOREIGN[case]` copied from
    the healthy SAE over the damaged one's; a refusal must name a stale file of the latter."""
    foreign = FOREIGN[case]
    stale = tuple(f"saes/{SAE1}/{name}" for name in foreign.stale)
    results = _run_probes(source, work, lambda copy: copy_foreign(copy, foreign.copied), stale, READERS, base)
    return {name: ("follows", detail) if outcome == "silent" and name in foreign.follows else (outcome, detail)
            for name, (outcome, detail) in results.items()}


def run_eval_case(source: Path, work: Path, kind: str, how: str, base: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The read paths that open eval results on a copy of the atlas with eval file `kind`
    damaged `how`."""
    return _run_probes(source, work, lambda copy: damage(copy / EVAL_FILES[kind], how), (Path(EVAL_FILES[kind]).name,),
                       EVAL_READERS, base)


# an imported circuit-tracer CLT, in an atlas of its own --------------------------------
def build_clt_atlas(root: Path) -> Path:
    """An atlas of a tiny ReLU GPT-2 model with an exact circuit-tracer CLT of its MLPs
    imported as `CLT_ID` (the source folder beside the atlas)."""
    from sae_atlas.saes.importing.clt import import_clt
    from sae_atlas.saes.models import load_model
    from sae_atlas.store.layout import AtlasLayout
    from tests.saes.test_clt_import import _exact_clt

    AtlasLayout(root).write_meta({"model": CLT_MODEL, "model_name": "tiny"})
    handle = load_model(CLT_MODEL)
    import_clt(root, _exact_clt(root.parent / "clt-source", handle), clt_id=CLT_ID, model_handle=handle,
               n_tokens=256, ce_blocks=0)
    return root


CLT_MODEL = {"kind": "tiny", "arch": "gpt2", "n_layers": 2, "d_model": 16, "d_mlp": 32, "act_fn": "relu", "seed": 3}
CLT_PROMPT = "the cat sat on the mat"


def _clt_graph(root: Path) -> Any:
    view = _atlas(root).graph(CLT_PROMPT, supernodes=False, clt=CLT_ID)
    return {"dictionaries": view.dictionaries, "scores": view.scores, "nodes": len(view.graph["nodes"])}


def _clt_http(root: Path) -> Any:
    from starlette.testclient import TestClient

    from sae_atlas.api.http import ServerSettings, create_app

    settings = ServerSettings(root=root, allow_interventions=True)  # graphs are served only then
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        response = client.post("/graph", json={"text": CLT_PROMPT, "clt": CLT_ID})
        body = response.json()
    return [("/graph", response.status_code, body if response.status_code >= 400 else len(body["graph"]["nodes"]))]


def _clt_load(root: Path) -> Any:
    from sae_atlas.saes.transcoders.clt_store import load_atlas_clt

    clt = load_atlas_clt(root, CLT_ID)
    return {"cfg": clt.cfg.__dict__, "sum": float(sum(p.detach().double().sum() for p in clt.parameters()))}


CLT_PROBES: dict[str, Callable[[Path], Any]] = {
    "clt_ids": lambda root: _atlas(root).clt_ids,
    "load_atlas_clt": _clt_load,
    "graph": _clt_graph,
    "http": _clt_http,
}


def clt_baselines(root: Path) -> dict[str, Any]:
    """Every CLT probe's answer on the undamaged CLT atlas."""
    return {name: probe(root) for name, probe in CLT_PROBES.items()}


def run_clt_case(source: Path, work: Path, kind: str, how: str, base: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every CLT read path on a copy of the CLT atlas with file `kind` of its CLT damaged `how`."""
    return _run_probes(source, work, lambda copy: damage(copy / CLT_FILES[kind], how), (kind,), tuple(CLT_PROBES),
                       base, CLT_PROBES)


# register's inputs ----------------------------------------------------------------------
def _unregister(root: Path, kind: str) -> None:
    """Drop the owner of register file `kind` from its registry (atlas.json's `saes`, or
    its kind's runs.json)."""
    from sae_atlas.store.layout import AtlasLayout

    layout = AtlasLayout(root)
    if kind.startswith("SAE "):
        layout.update_meta(saes={k: v for k, v in layout.read_meta()["saes"].items() if k != SAE1})
        return
    runs = root / "analyses" / PLANTED_KIND / "runs.json"
    listed = json.loads(runs.read_text())
    listed["runs"].pop(PLANTED_RUN)
    runs.write_text(json.dumps(listed))


def _register(kind: str) -> Callable[[Path], Any]:
    """`sae-atlas register` of the owner of file `kind`: what it recorded."""
    def probe(root: Path) -> Any:
        from sae_atlas.saes.atlas_records import register_sae
        from sae_atlas.store.analysis_runs import register_run

        if kind.startswith("SAE "):
            return register_sae(root, SAE1)
        register_run(root, PLANTED_KIND, PLANTED_RUN)
        return json.loads((root / "analyses" / PLANTED_KIND / "runs.json").read_text())

    return probe


def register_baseline(source: Path, work: Path, kind: str) -> Any:
    """What register records for the owner of `kind`, undamaged, on a copy at `work`."""
    shutil.copytree(source, work)
    _unregister(work, kind)
    return _register(kind)(work)


def run_register_case(source: Path, work: Path, kind: str, how: str, baseline: Any) -> dict[str, tuple[str, str]]:
    """`register` on a copy of the atlas whose owner of file `kind` is unregistered and the
    file damaged `how`: the record it made (compared with the undamaged one), or its refusal."""

    def harm(copy: Path) -> None:
        _unregister(copy, kind)
        damage(copy / REGISTER_FILES[kind], how)

    return _run_probes(source, work, harm, (Path(REGISTER_FILES[kind]).name,), ("register",), {"register": baseline},
                       {"register": _register(kind)})


def cell(results: dict[str, tuple[str, str]]) -> str:
    """A table cell: the overall outcome and which read paths refused or reported."""
    overall = worst([outcome for outcome, _ in results.values()])
    if overall == "same":
        return "unaffected"
    by = {o: [name for name, (out, _) in results.items() if out == o] for o in ("refused", "reported", "follows")}
    parts = [f"{o} by {', '.join(names)}" for o, names in by.items() if names]
    bad = [f"{name}: {out}" for name, (out, _) in results.items() if out not in ACCEPTABLE]
    return "; ".join(bad + parts)


Outcomes = dict[str, tuple[str, str]]


def _damage_table(heading: str, files: dict[str, str], outcomes: dict[tuple[str, str], Outcomes]) -> list[str]:
    lines = [f"| {heading} | " + " | ".join(DAMAGES) + " |", "|---|" + "---|" * len(DAMAGES)]
    for kind in files:
        lines.append(f"| {kind} | " + " | ".join(cell(outcomes[kind, how]) for how in DAMAGES) + " |")
    return lines


def table(outcomes: dict[tuple[str, str], Outcomes], foreign: dict[str, Outcomes],
          groups: dict[str, dict[tuple[str, str], Outcomes]]) -> str:
    """The markdown tables: file kind x damage -> outcome, foreign files -> outcome, then eval
    results, the imported CLT and register's inputs (`groups` by `GROUPS` name)."""
    lines = _damage_table("file", FILES, outcomes)
    lines += ["", "| copied from the healthy SAE | outcome |", "|---|---|"]
    for case, files in FOREIGN.items():
        lines.append(f"| {case} ({', '.join(files.copied)}) | {cell(foreign[case])} |")
    for name, (heading, files) in GROUPS.items():
        lines += ["", *_damage_table(heading, files, groups[name])]
    return "\n".join(lines)


GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "evals": (f"eval file of {SAE1}", EVAL_FILES),
    "clt": ("file of an imported circuit-tracer CLT", CLT_FILES),
    "register": ("input of `sae-atlas register`", REGISTER_FILES),
}


def write_table(document: Path, rendered: str) -> None:
    """Replace the generated block of `document` with `rendered`."""
    text = document.read_text()
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    document.write_text(f"{head}{TABLE_START}\n{rendered}\n{TABLE_END}{tail}")


def generated_table(document: Path) -> str:
    """The generated block currently in `document`."""
    return document.read_text().partition(TABLE_START)[2].partition(TABLE_END)[0].strip()


def main(argv: list[str]) -> None:
    """Run the whole battery and write its tables into RELIABILITY.md (or the path given)."""
    import tempfile

    document = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "RELIABILITY.md"
    with tempfile.TemporaryDirectory() as tmp:
        source = build_battery_atlas(Path(tmp) / "atlas")
        base = baselines(source)
        outcomes = {}
        for kind in FILES:
            for how in DAMAGES:
                outcomes[kind, how] = run_case(source, Path(tmp) / f"case-{len(outcomes)}", kind, how, base)
                print(kind, how, cell(outcomes[kind, how]), flush=True)
        foreign = {}
        for case in FOREIGN:
            foreign[case] = run_foreign(source, Path(tmp) / f"foreign-{len(foreign)}", case, base)
            print("foreign", case, cell(foreign[case]), flush=True)
        groups: dict[str, dict[tuple[str, str], Outcomes]] = {name: {} for name in GROUPS}
        clt_source = build_clt_atlas(Path(tmp) / "clt" / "atlas")
        clt_base = clt_baselines(clt_source)
        for i, (name, kind, how) in enumerate((n, k, h) for n, (_, files) in GROUPS.items() for k in files
                                              for h in DAMAGES):
            work = Path(tmp) / f"group-{i}"
            if name == "evals":
                groups[name][kind, how] = run_eval_case(source, work, kind, how, base)
            elif name == "clt":
                groups[name][kind, how] = run_clt_case(clt_source, work, kind, how, clt_base)
            else:
                baseline = register_baseline(source, Path(tmp) / f"register-base-{i}", kind)
                groups[name][kind, how] = run_register_case(source, work, kind, how, baseline)
            print(name, kind, how, cell(groups[name][kind, how]), flush=True)
    write_table(document, table(outcomes, foreign, groups))


if __name__ == "__main__":
    main(sys.argv[1:])
