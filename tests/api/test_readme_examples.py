"""Every example in README.md and the docs site's pages (docs/*.md, in the order of the nav in
mkdocs.yml) runs against a copy of the small atlas, so the docs cannot rot.

Fenced blocks of each page are read as follows:
- `python` blocks run statement by statement in a folder holding the copy as `atlas-demo/`
  (and `atlas-small/`, the docs' other worked atlas), after SUBSTITUTIONS (the demo's
  SAE ids, hooks, features and sizes -> the small atlas's) and with `names()` predefined
  (what the pages leave to the reader: `atlas`, `text`, `direction`, ...). An expression that
  gives a table or a list must give a non-empty one: an example that finds nothing is broken.
- `sh` / `bash` blocks, and `$ ` lines of output blocks: every `sae-atlas` command (and what
  `torchrun ... -m sae_atlas` runs) is parsed by the real CLI, so an unknown verb or option fails,
  and then run in-process, in page order, unless marked. `[...]` (optional parts) are
  left out, `a|b` takes a.
- Markers, an HTML comment on the line right before the fence (its reason is the skip reason):
  `<!-- readme-test: skip: REASON -->` nothing in the block runs;
  `<!-- readme-test: parse-only: REASON -->` commands are parsed, none is run;
  `<!-- readme-test: parse-only VERB ...: REASON -->` those verbs are parsed, the rest run.
  Only parsed, too: `torchrun` lines, `sae-atlas serve` (a server runs until stopped) and
  commands on a placeholder atlas (`A`, `ATLAS_A:SAE_A`): only `atlas-demo` and `atlas-small`
  are examples.
- `sae-atlas ...` spans in the prose name real verbs and options (placeholders allowed).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
NAV_PAGE = re.compile(r"^\s*- (?:\"[^\"]*\"|[^:\"]+):\s*(\S+\.md)\s*$", re.M)
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|parse-only)((?:\s+[\w-]+)*)\s*:\s*(.*?)\s*-->")
EXAMPLE_ATLASES = {"atlas-demo", "atlas-small"}
FENCE = re.compile(r"^```(\w*)\s*$")

# The demo's names -> the small atlas's (2 layers, d_model 32, two 64-latent TopK SAEs).
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"atlas-demo:blocks\.22\.hook_resid_post-topk-4608", "atlas-small:{sae1}"),  # a third member
    (r"blocks\.8\.hook_resid_post-topk-4608", "{sae0}"),
    (r"blocks\.(15|22)\.hook_resid_post-topk-4608", "{sae1}"),
    (r"blocks\.4\.hook_resid_post-topk-1024", "{sae0}"),
    (r"blocks\.(4|8)\.hook_resid_post", "blocks.0.hook_resid_post"),
    (r"blocks\.(15|22)\.hook_resid_post", "blocks.1.hook_resid_post"),
    (r'load_model\("smollm2-135m"\)', 'load_model({"kind": "tiny", "n_layers": 2, "d_model": 32})'),
    (r"n_tokens=65536", "n_tokens=2048"),
    (r"batches\(4096", "batches(256"),
    (r"--layers 3,6,9,12,15", "--layers 0,1"),
    (r'steering_features\(" Friday"\)',  # a small search: few prompts and candidates, one prompt style
     'steering_features("friday", k=2, n_prompts=4, candidates=4, confirm_prompts=2, combine=0, styles=("neutral",))'),
    (r'" Friday"', '"friday"'),  # the tiny word-level vocabulary: lower case, no leading space
    (r'"match": "Monday"', '"match": "monday"'),
    (r"\b123\b", "12"),  # feature numbers of the demo's 4608-latent SAEs
    (r"\b226\b", "26"),
    (r"2_102_15", "{graph_node}"),  # a feature node of the example prompt's graph
]

# Examples that find nothing on the small atlas, and why.
EMPTY_ON_SMALL_ATLAS = {
    "atlas.geometry_features(in_circle=True, period=7)": "the tiny random model stores no 7-value circle",
}


def names(root: Path, ids: list[str]) -> dict[str, Any]:
    """What the pages' Python leaves to the reader."""
    from sae_atlas import Atlas

    rng = np.random.default_rng(0)
    direction = rng.standard_normal(32).astype(np.float32)
    return {"atlas": Atlas(root), "sae_id": ids[1], "sid": ids[0], "a": ids[0], "b": ids[1],
            "sae8": ids[0], "sae15": ids[1], "sae22": f"atlas-small:{ids[1]}", "other_atlas": root,
            "direction": direction, "direction_576": direction,
            "text": "Today is Monday, so tomorrow is"}


def pages() -> list[Path]:
    """README.md, then the site's pages in the order of mkdocs.yml's nav."""
    nav = NAV_PAGE.findall((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    return [REPO / "README.md", *(REPO / "docs" / name for name in nav)]


@dataclass
class Block:
    """One fenced block of a page."""

    page: str  # the page's path in the repository
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    marker: tuple[Literal["skip", "parse-only"], set[str], str] | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> Literal["python", "shell"] | None:
        if self.lang == "python":
            return "python"
        if self.lang in ("sh", "bash", "console") or (not self.lang and re.search(r"^\$ ", self.body, re.M)):
            return "shell"
        return None


def page_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(REPO).as_posix()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found = MARKER.search(lines[i - 1]) if i else None
        marker = (found.group(1), set(found.group(2).split()), found.group(3)) if found else None
        blocks.append(Block(name, i + 1, opening.group(1), "\n".join(lines[i + 1:end]), marker))
        i = end + 1
    return [b for b in blocks if b.kind]


def _complete(command: str) -> bool:
    """Whether a command ends here (no trailing backslash, no quote left open)."""
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return not command.endswith("\\")


def _command_lines(text: str) -> Iterator[str]:
    """Whole command lines: backslash continuations joined, a quote left open carried over."""
    line = ""
    for piece in text.splitlines():
        line = f"{line}\n{piece}" if line else piece
        if _complete(line):
            yield re.sub(r"\\\n", " ", line)
            line = ""
    assert not line, f"unclosed command {line!r}"


def commands(block: Block, text: str) -> list[tuple[str, list[str]]]:
    """`(program, sae-atlas arguments)` of each command in `text`, a shell block's body
    (`sae-atlas`, or `torchrun` with what it runs under `-m sae_atlas`)."""
    if not block.lang:  # an output block: only its `$ ` lines and their continuations
        kept: list[str] = []
        for line in text.splitlines():
            if line.startswith("$ "):
                kept.append(line[2:])
            elif kept and not _complete(kept[-1]):
                kept[-1] += "\n" + line
        text = "\n".join(kept)
    found: list[tuple[str, list[str]]] = []
    for line in _command_lines(text):
        line = re.sub(r"\s\[[^\]]*\]", "", line)  # optional parts
        words = [w for w in shlex.split(line, comments=True) if w != "..."]
        if words[:1] == ["sae-atlas"]:
            found.append(("sae-atlas", words[1:]))
        elif words[:1] == ["torchrun"]:
            found.append(("torchrun", words[words.index("sae_atlas") + 1:]))
        elif words:
            raise AssertionError(f"{block.where}: {words[0]!r} is not sae-atlas; mark the block")
    return [(program, [w.split("|")[0] if re.fullmatch(r"[\w-]+(\|[\w-]+)+", w) else w for w in args])
            for program, args in found]


def resolve(args: list[str]) -> tuple[str, Any, list[str]]:
    """`(verbs, click command, the arguments after the verbs)` of `args`, nothing checked beyond."""
    from sae_atlas.api.cli import app

    command, verbs = typer.main.get_command(app), []
    while isinstance(command, typer.core.TyperGroup) and args and args[0] in command.commands:
        verbs.append(args[0])
        command, args = command.commands[args[0]], args[1:]
    return " ".join(verbs), command, args


def parse(args: list[str]) -> str:
    """Parse `args` as the CLI would (every option checked), without running; the verb."""
    from sae_atlas.api.cli import app

    command = typer.main.get_command(app)
    ctx = command.make_context("sae-atlas", list(args))
    verbs = []
    while isinstance(command, typer.core.TyperGroup):  # typer's own copy of click's Group
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        verbs.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return " ".join(verbs)


def substitute(text: str, values: dict[str, str]) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        for name, value in values.items():
            replacement = replacement.replace("{" + name + "}", value)
        text = re.sub(pattern, replacement.replace("\\", "\\\\"), text)
    return text


BLOCKS = [block for page in pages() for block in page_blocks(page)]


@pytest.fixture(scope="module")
def workdir(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A folder with copies of the small atlas as `atlas-demo` and `atlas-small` (the third
    member of the docs' series of layers), holding what the demo stores (the weekday circle run
    under the demo's name, steering tables, a comparison), and the values SUBSTITUTIONS use."""
    from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.intervene.concepts import weekdays
    from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores

    folder = tmp_path_factory.mktemp("readme")
    root = folder / "atlas-demo"
    shutil.copytree(small_atlas["root"], root)
    atlas = Atlas(root)
    handle = atlas.model()
    write_concept_run(root, "weekdays-smollm2-135m", run_circle_analysis(handle, weekdays(), [0, 1]),
                      model=handle.name)
    for sae_id in small_atlas["sae_ids"]:
        compute_steering_scores(handle, root, sae_id, SteeringParams(n_prompts=4, prompt_tokens=8, chunk=64),
                                progress=False)
    shutil.copytree(root, folder / "atlas-small")
    graph = atlas.graph("Let's do some days of the week math. Two days from Monday is", targets=" Wednesday")
    node = next(n["node_id"] for n in graph.top_nodes if n["kind"] == "feature")
    atlas.compare(root, sae=small_atlas["sae_ids"][0], other_sae=small_atlas["sae_ids"][1], n_tokens=2048,
                  sample_tokens=256, n_perm=5, run="demo-comparison")  # the demo stores one
    ids = small_atlas["sae_ids"]
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        yield {"folder": folder, "root": root, "ids": ids,
               "values": {"sae0": ids[0], "sae1": ids[1], "graph_node": node}}
    finally:
        os.chdir(cwd)


def _empty(value: Any) -> bool:
    import polars as pl

    if isinstance(value, pl.DataFrame | list | dict | tuple):
        return len(value) == 0
    return False


def run_python(block: Block, work: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    source = substitute(block.body, work["values"])
    namespace = names(work["root"], work["ids"])
    for statement in ast.parse(source).body:
        code = ast.get_source_segment(source, statement)
        where = f"{block.page}:{block.line + statement.lineno}: {code}"
        if isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), where, "eval"), namespace)
            assert not _empty(value) or code in EMPTY_ON_SMALL_ATLAS, f"{where} gives nothing on the small atlas"
        else:
            exec(compile(ast.Module([statement], []), where, "exec"), namespace)


def run_shell(block: Block, work: dict[str, Any]) -> None:
    from sae_atlas.api.cli import app

    parse_only = block.marker[1] if block.marker else set()
    for program, args in commands(block, substitute(block.body, work["values"])):
        verb = parse(args)
        on_example_atlas = any(a.split(":")[0] in EXAMPLE_ATLASES for a in args)
        marked = block.marker is not None and (not parse_only or verb.split()[0] in parse_only)
        if program == "torchrun" or verb == "serve" or not on_example_atlas or marked:
            continue
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, f"{block.where}: sae-atlas {shlex.join(args)}\n{result.output}"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.where}-{b.kind}" for b in BLOCKS])
def test_readme_example_runs(block: Block, workdir: dict[str, Any]) -> None:
    if block.marker and block.marker[0] == "skip":
        pytest.skip(f"{block.where}: {block.marker[2]}")
    if block.kind == "python":
        run_python(block, workdir)
    else:
        run_shell(block, workdir)


def prose_commands(page: Path) -> list[str]:
    """What follows `sae-atlas` in the code spans of a page's prose (fenced blocks left out)."""
    prose = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    return re.findall(r"`sae-atlas ([^`]+)`", prose) + re.findall(r"`torchrun [^`]*-m sae_atlas\s([^`]+)`", prose)


def test_every_page_is_read() -> None:
    """The walk covers README.md and every page of docs/ (a page outside the nav would be
    missed here; tests/test_docs_site.py fails the build on it too)."""
    assert {p.name for p in pages()[1:]} == {p.name for p in (REPO / "docs").glob("*.md")}
    assert sum(b.kind == "python" for b in BLOCKS) > 10 and sum(b.kind == "shell" for b in BLOCKS) > 10
    assert sum(len(prose_commands(p)) for p in pages()) > 10


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_readme_prose_commands_name_real_verbs_and_options(page: Path) -> None:
    for span in prose_commands(page):
        words = [w.split("|")[0] for w in shlex.split(span)]
        verbs, command, rest = resolve(words)
        if words == ["--help"]:  # the command line's own help
            continue
        assert verbs and not isinstance(command, typer.core.TyperGroup), f"`sae-atlas {span}`: no such verb"
        known = {"--help", *(o for p in command.params for o in (*p.opts, *p.secondary_opts))}
        unknown = [w for w in rest if w.startswith("--") and w.split("=")[0] not in known]
        assert not unknown, f"`sae-atlas {span}`: {verbs} has no option {unknown}"
