"""Concept trees for the hierarchy tests: a curated hierarchy of common English words, a
JSON loader, and a reader of the WordNet noun hierarchy (Princeton WordNet database files
`data.noun` / `index.noun`, e.g. Debian's `wordnet-base` under /usr/share/wordnet).

A node's token set is its own words plus those of all its descendants (Park et al. 2024
use the WordNet hyponym closure the same way). `tokenize_tree` keeps the words that are
one token with a leading space (`" dog"`), given any `encode(text) -> list[int]`
callable, drops words that would sit in two unrelated branches, prunes nodes with too
few tokens and splices out nodes whose token set equals their parent's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sae_atlas.errors import InvalidInputError, NotFoundError

# name: (words, children). Each word appears once; ambiguous words (bat, bass, crane,
# orange, palm, ...) are left out on purpose.
CURATED: dict[str, Any] = {
    "entity": ([], {
        "organism": ([], {
            "animal": (["animal", "creature", "beast"], {
                "mammal": ("dog cat horse cow pig sheep goat lion tiger bear wolf fox deer rabbit "
                           "mouse rat elephant monkey camel zebra giraffe whale dolphin squirrel "
                           "donkey leopard kangaroo panda otter beaver hippo gorilla buffalo moose "
                           "hamster".split(), {}),
                "bird": ("eagle hawk owl sparrow robin crow parrot pigeon duck goose swan chicken "
                         "penguin ostrich falcon dove gull finch peacock hen rooster raven vulture "
                         "stork heron flamingo".split(), {}),
                "fish": ("salmon trout tuna cod shark carp herring sardine eel catfish perch "
                         "goldfish mackerel halibut anchovy minnow".split(), {}),
                "insect": ("ant bee wasp mosquito beetle butterfly moth grasshopper termite flea "
                           "locust ladybug dragonfly cockroach caterpillar".split(), {}),
                "reptile": ("snake lizard turtle crocodile alligator tortoise iguana cobra gecko "
                            "viper dinosaur".split(), {}),
            }),
            "plant": (["plant", "shrub", "weed"], {
                "tree": "oak pine maple birch willow elm cedar spruce fir beech cypress redwood "
                        "sequoia".split(),
                "flower": "rose tulip lily daisy orchid sunflower violet lotus poppy jasmine "
                          "daffodil lavender".split(),
            }),
        }),
        "food": (["food", "meal"], {
            "fruit": "apple banana grape pear peach cherry lemon lime mango plum melon strawberry "
                     "pineapple apricot coconut fig raspberry blueberry watermelon".split(),
            "vegetable": "carrot potato onion tomato cabbage lettuce pea bean corn garlic spinach "
                         "celery cucumber broccoli pumpkin radish".split(),
            "dish": "bread cheese butter soup pizza pasta rice cake pie salad sandwich burger "
                    "noodle cookie steak".split(),
            "drink": "water milk coffee tea juice beer wine soda whiskey vodka lemonade".split(),
        }),
        "artifact": (["object", "device", "thing"], {
            "tool": "hammer saw drill wrench knife axe shovel screwdriver chisel rake scissors "
                    "needle".split(),
            "vehicle": "car truck bus train bicycle boat ship plane motorcycle taxi tractor van "
                       "jet helicopter".split(),
            "furniture": "chair table bed sofa desk shelf couch bench cabinet stool dresser".split(),
            "clothing": "shirt dress coat jacket hat shoe sock skirt sweater glove scarf boot "
                        "belt".split(),
            "instrument": "piano guitar violin drum flute trumpet harp cello saxophone clarinet".split(),
            "weapon": "gun sword rifle spear pistol dagger cannon bomb missile".split(),
        }),
        "place": (["place", "location"], {
            "building": "house church school hospital castle temple tower barn hotel palace "
                        "library museum".split(),
            "landform": "mountain river lake hill valley ocean sea island desert forest beach "
                        "canyon".split(),
            "country": "France Germany Japan China India Brazil Canada Italy Spain Mexico Russia "
                       "Egypt Australia Kenya".split(),
        }),
        "person": (["person", "people"], {
            "profession": "doctor teacher lawyer nurse farmer engineer soldier pilot chef artist "
                          "writer singer".split(),
            "relative": "mother father brother sister uncle aunt cousin son daughter grandmother "
                        "grandfather".split(),
        }),
        "body_part": "hand foot head arm leg eye ear nose mouth finger knee neck shoulder".split(),
        "color": "red blue green yellow black white purple pink brown gray".split(),
    }),
}


@dataclass
class ConceptNode:
    """One concept: its own words, its parent (None at the root) and its children."""

    name: str
    parent: str | None
    words: list[str]
    children: list[str] = field(default_factory=list)


@dataclass
class ConceptTree:
    """A rooted tree of concepts, parents before children in `nodes`."""

    nodes: dict[str, ConceptNode]
    source: str = "custom"

    @property
    def root(self) -> str:
        return next(iter(self.nodes))

    def words_under(self, name: str) -> list[str]:
        """The node's words and all its descendants' words (its token set, as words)."""
        out, stack = [], [name]
        while stack:
            node = self.nodes[stack.pop()]
            out.extend(node.words)
            stack.extend(node.children)
        return out

    def ancestors(self, name: str) -> list[str]:
        """Parent, grandparent, ... of a node (nearest first)."""
        out, parent = [], self.nodes[name].parent
        while parent is not None:
            out.append(parent)
            parent = self.nodes[parent].parent
        return out

    def edges(self) -> list[tuple[str, str]]:
        """All `(child, parent)` pairs."""
        return [(n.name, n.parent) for n in self.nodes.values() if n.parent is not None]

    def to_dict(self, name: str | None = None) -> dict[str, Any]:
        """The nested JSON form `{"name", "words", "children": [...]}` (what `tree_from_json` reads)."""
        node = self.nodes[name or self.root]
        return {"name": node.name, "words": list(node.words), "children": [self.to_dict(c) for c in node.children]}


def tree_from_nested(data: dict[str, Any], source: str = "custom") -> ConceptTree:
    """Build a tree from the nested JSON form; InvalidInputError on a malformed node."""
    nodes: dict[str, ConceptNode] = {}
    queue: list[tuple[dict[str, Any], str | None]] = [(data, None)]
    while queue:
        item, parent = queue.pop(0)
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError(f"tree node must be an object with a 'name' string, got {item!r:.80}")
        name = item["name"]
        words, children = item.get("words", []), item.get("children", [])
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise InvalidInputError(f"tree node {name!r}: 'words' must be a list of strings")
        if not isinstance(children, list):
            raise InvalidInputError(f"tree node {name!r}: 'children' must be a list")
        if name in nodes:
            raise InvalidInputError(f"tree node name {name!r} appears twice; names must be unique")
        nodes[name] = ConceptNode(name, parent, list(words))
        if parent is not None:
            nodes[parent].children.append(name)
        queue.extend((child, name) for child in children)
    return ConceptTree(nodes, source)


def _curated_nested(name: str, spec: Any) -> dict[str, Any]:
    words, children = spec if isinstance(spec, tuple) else (spec, {})
    return {"name": name, "words": list(words), "children": [_curated_nested(k, v) for k, v in children.items()]}


def curated_tree() -> ConceptTree:
    """The built-in hierarchy of common English words (animals, plants, food, objects,
    places, people, body parts, colours), about 400 words in 40 concepts."""
    (name, spec), = CURATED.items()
    return tree_from_nested(_curated_nested(name, spec), source="curated")


def tree_from_json(path: str | Path) -> ConceptTree:
    """Read a tree from a JSON file in the nested form `{"name", "words", "children"}`."""
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"concept tree file {p} does not exist")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{p}: not valid JSON ({exc})") from exc
    return tree_from_nested(data, source=str(p))


# WordNet ----------------------------------------------------------------------------------
WORDNET_DIRS = ("/usr/share/wordnet", "/usr/share/wordnet/dict", "/usr/local/share/wordnet")


def wordnet_dir(explicit: str | Path | None = None) -> Path | None:
    """The first directory holding `data.noun` and `index.noun`: `explicit`, `$WNSEARCHDIR`,
    then the usual system locations; None when WordNet is not installed."""
    candidates = [explicit] if explicit is not None else [os.environ.get("WNSEARCHDIR"), *WORDNET_DIRS]
    for c in candidates:
        if c and (Path(c) / "data.noun").is_file() and (Path(c) / "index.noun").is_file():
            return Path(c)
    return None


@dataclass
class _Synset:
    lemmas: list[str]
    hyponyms: list[str]


def _data_lines(path: Path) -> Iterable[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line and not line.startswith(" "):  # the licence header is indented
                yield line


def _read_data_noun(path: Path) -> dict[str, _Synset]:
    synsets = {}
    for line in _data_lines(path):
        fields = line.split(" | ")[0].split()
        offset, w_cnt = fields[0], int(fields[3], 16)
        lemmas = [fields[4 + 2 * i] for i in range(w_cnt)]
        pos = 4 + 2 * w_cnt
        p_cnt = int(fields[pos])
        hyponyms = [
            fields[pos + 1 + 4 * j + 1]
            for j in range(p_cnt)
            if fields[pos + 1 + 4 * j] in ("~", "~i") and fields[pos + 1 + 4 * j + 2] == "n"
        ]
        synsets[offset] = _Synset([lemma.split("(")[0] for lemma in lemmas], hyponyms)
    return synsets


def _read_index_noun(path: Path) -> dict[str, list[str]]:
    index = {}
    for line in _data_lines(path):
        fields = line.split()
        lemma, synset_cnt, p_cnt = fields[0], int(fields[2]), int(fields[3])
        index[lemma] = fields[4 + p_cnt + 2 : 4 + p_cnt + 2 + synset_cnt]
    return index


def _synset_name(offset: str, synsets: dict[str, _Synset], index: dict[str, list[str]]) -> str:
    lemma = synsets[offset].lemmas[0].lower()
    senses = index.get(lemma, [])
    sense = senses.index(offset) + 1 if offset in senses else 0
    return f"{lemma}.n.{sense:02d}"


def wordnet_tree(
    root: str = "entity.n.01", *, directory: str | Path | None = None, max_depth: int = 12
) -> ConceptTree | None:
    """The WordNet noun hierarchy under `root` (`lemma.n.NN`) as a tree, or None when no
    WordNet database is installed. WordNet is a DAG: each synset keeps the parent through
    which a breadth-first walk of hyponym links from `root` first reaches it (its
    shallowest path). Words are its single-word lemmas (multi-word lemmas contain '_')."""
    folder = wordnet_dir(directory)
    if folder is None:
        return None
    synsets = _read_data_noun(folder / "data.noun")
    index = _read_index_noun(folder / "index.noun")
    lemma, _, sense = root.rpartition(".n.")
    offsets = index.get(lemma.lower(), [])
    if not lemma or not sense.isdigit() or not 1 <= int(sense) <= len(offsets):
        raise InvalidInputError(f"unknown WordNet noun synset {root!r}; write it as lemma.n.NN, e.g. animal.n.01")
    start = offsets[int(sense) - 1]
    nodes: dict[str, ConceptNode] = {}
    names: dict[str, str] = {}
    queue: list[tuple[str, str | None, int]] = [(start, None, 0)]
    while queue:
        offset, parent, depth = queue.pop(0)
        if offset in names or offset not in synsets:
            continue
        name = names[offset] = _synset_name(offset, synsets, index)
        words = [w for w in synsets[offset].lemmas if "_" not in w and "-" not in w]
        nodes[name] = ConceptNode(name, parent, words)
        if parent is not None:
            nodes[parent].children.append(name)
        if depth < max_depth:
            queue.extend((h, name, depth + 1) for h in synsets[offset].hyponyms)
    return ConceptTree(nodes, source=f"wordnet:{folder}")


# tokenizer-aware filtering ----------------------------------------------------------------
@dataclass
class TokenizedTree:
    """A tree restricted to single-token words, with each node's token-id set."""

    tree: ConceptTree
    token_ids: dict[str, np.ndarray]  # node -> sorted unique ids of its token set
    word_ids: dict[str, int]
    dropped_words: dict[str, str]  # word -> why it was dropped
    dropped_nodes: list[str]


def single_token_id(word: str, encode: Callable[[str], list[int]], leading_space: bool = True) -> int | None:
    """The id of `word` if `encode(" " + word)` (or `encode(word)`) is exactly one token."""
    ids = list(encode((" " if leading_space else "") + word))
    return int(ids[0]) if len(ids) == 1 else None


def tokenize_tree(
    tree: ConceptTree,
    encode: Callable[[str], list[int]],
    *,
    leading_space: bool = True,
    min_tokens: int = 5,
    max_nodes: int | None = None,
) -> TokenizedTree:
    """Restrict `tree` to words that are a single token (see module docstring).

    `encode` is any tokenizer-like callable returning ids without special tokens, e.g.
    `lambda s: tok.encode(s, add_special_tokens=False)`. Nodes with fewer than
    `min_tokens` tokens are removed with their subtrees; `max_nodes` keeps the first
    nodes in breadth-first order (parents before children).
    """
    homes: dict[str, list[str]] = {}
    for node in tree.nodes.values():
        for w in node.words:
            homes.setdefault(w, []).append(node.name)
    word_ids, dropped = {}, {}
    for word, where in homes.items():
        deepest = max(where, key=lambda n: len(tree.ancestors(n)))
        if any(n != deepest and n not in tree.ancestors(deepest) for n in where):
            dropped[word] = f"in unrelated concepts {sorted(set(where))}"
            continue
        tid = single_token_id(word, encode, leading_space)
        if tid is None:
            dropped[word] = "not a single token"
        else:
            word_ids[word] = tid
    home = {w: max(homes[w], key=lambda n: len(tree.ancestors(n))) for w in word_ids}
    own: dict[str, list[str]] = {n: [] for n in tree.nodes}
    for w, n in home.items():
        own[n].append(w)
    draft = ConceptTree(
        {n: ConceptNode(n, node.parent, own[n], list(node.children)) for n, node in tree.nodes.items()},
        tree.source,
    )
    ids_of = {n: np.unique([word_ids[w] for w in draft.words_under(n)]).astype(np.int64) for n in draft.nodes}
    kept: dict[str, ConceptNode] = {}
    alias: dict[str, str] = {}  # node -> the kept node that now holds its words
    dropped_nodes: list[str] = []
    for name, node in draft.nodes.items():  # parents come first
        parent = alias.get(node.parent) if node.parent is not None else None
        if node.parent is not None and parent is None:  # inside a dropped subtree
            continue
        if parent is not None and np.array_equal(ids_of[parent], ids_of[name]):
            kept[parent].words.extend(node.words)  # same token set as its parent: splice out
            alias[name] = parent
            dropped_nodes.append(name)
            continue
        full = max_nodes is not None and len(kept) >= max_nodes
        if parent is not None and (len(ids_of[name]) < min_tokens or full):
            kept[parent].words.extend(draft.words_under(name))  # the parent keeps these tokens
            dropped_nodes.extend(n for n in draft.nodes if n == name or name in draft.ancestors(n))
            continue
        if parent is None and len(ids_of[name]) < min_tokens:
            raise InvalidInputError(
                f"the tree's root {name!r} has only {len(ids_of[name])} single-token words "
                f"(min_tokens={min_tokens}); check that `encode` is the model's tokenizer"
            )
        kept[name] = ConceptNode(name, parent, list(node.words))
        alias[name] = name
        if parent is not None:
            kept[parent].children.append(name)
    return TokenizedTree(
        tree=ConceptTree(kept, tree.source),
        token_ids={n: ids_of[n] for n in kept},
        word_ids=word_ids,
        dropped_words=dropped,
        dropped_nodes=dropped_nodes,
    )
