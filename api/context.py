"""What every service of the facade shares: the atlas root and layout, atlas.json, the
process-wide resource cache, the decoder-direction search and the model runner.

Services take an `AtlasContext` (and `api.sae_view.SaeView`s opened from it), never the
`Atlas` facade, so nothing below the facade reaches back into it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sae_atlas.errors import IntegrityError, NotFoundError
from sae_atlas.saes.models import DEFAULT_MODEL, ModelHandle, load_model, normalize_spec
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.search import FeatureSearch

T = TypeVar("T")


class ResourceCache:
    """Loads each keyed resource once (thread-safe) and returns the same object afterwards;
    a resource read from a file that is rewritten in place is kept per version (`current`)."""

    def __init__(self) -> None:
        self._items: dict[tuple[Any, ...], Any] = {}
        self._versions: dict[tuple[Any, ...], tuple[Hashable, Any]] = {}
        self._lock = threading.RLock()  # loaders may load other resources

    def get(self, key: tuple[Any, ...], load: Callable[[], T]) -> T:
        """The resource under `key`, calling `load()` the first time."""
        if key in self._items:
            return self._items[key]
        with self._lock:
            if key not in self._items:
                self._items[key] = load()
            return self._items[key]

    def current(self, key: tuple[Any, ...], version: Hashable, load: Callable[[], T]) -> T:
        """The resource under `key` as of `version` (of the file it is read from): `load()`
        is called again when the version changed since the last call, and the copy of the
        older version is dropped."""
        held = self._versions.get(key)
        if held is not None and held[0] == version:
            return held[1]
        with self._lock:
            held = self._versions.get(key)
            if held is None or held[0] != version:
                held = self._versions[key] = (version, load())
            return held[1]


class AtlasContext:
    """One opened atlas directory and the resources loaded from it (kept for its lifetime)."""

    def __init__(self, root: str | Path, model: Any = None, *, new: bool = False) -> None:
        """Open the atlas at `root` (NotFoundError if it has no atlas.json); `model` (a
        ModelHandle or a model spec) overrides the spec atlas.json records. `new`: for the
        operations that build an atlas (`create`)."""
        self.layout = AtlasLayout(root)
        self.root = self.layout.root
        exists = self.layout.atlas_json.exists()
        if not exists and not new:
            raise NotFoundError(f"{self.root} is not an atlas (no atlas.json); create one with `sae-atlas cache`")
        self.meta = self.layout.read_meta() if exists else {}
        self.cache = ResourceCache()
        self.model_override = model if model is not None or exists else DEFAULT_MODEL
        self.model_lock = threading.Lock()
        """Held while the model runs: one model run at a time per atlas."""

    @classmethod
    def create(cls, root: str | Path, model: Any = None) -> AtlasContext:
        """The atlas at `root` for the operations that build one; writes nothing itself.
        Opened as usual when it has an atlas.json; else over a root that need not exist yet
        (empty `meta`) whose model is `model` or `saes.models.DEFAULT_MODEL`: the first write
        operation (cache, training from the model) creates the folder and atlas.json."""
        return cls(root, model, new=True)

    def reread_meta(self) -> None:
        """Read atlas.json again (after this process registered an SAE or created the atlas;
        still empty while nothing created it)."""
        self.meta = self.layout.read_meta() if self.layout.atlas_json.exists() else {}

    def sae_ids(self) -> list[str]:
        """Ids of the SAEs with saved weights or registered in atlas.json."""
        return self.layout.sae_ids()

    def recorded(self, sae_id: str) -> dict[str, Any]:
        """What atlas.json records of an SAE (empty when it records nothing)."""
        return self.meta.get("saes", {}).get(sae_id, {})

    def search(self) -> FeatureSearch:
        """The decoder-direction search over the atlas's FAISS indexes (one per process)."""
        return self.cache.get(("feature-search",), lambda: FeatureSearch(self.root))

    def model(self, device: str | None = None) -> ModelHandle:
        """The atlas's model on `device` (None: the process default, `saes.devices`): the
        handle given as `model=` as it is, else the spec given there or atlas.json's, loaded
        once per context and device, then kept."""
        spec = self.model_override if self.model_override is not None else self.meta.get("model")
        if spec is None:
            raise NotFoundError(f"{self.layout.atlas_json} records no model spec (key 'model')")
        return self.model_of(spec, device)

    def model_of(self, spec: Any, device: str | None = None) -> ModelHandle:
        """The model `spec` names (a ModelHandle is returned as it is) on `device`, loaded
        once per context and device: a second model of a two-model operation (`model_b`)
        comes through here too, so the atlas's own spec named again is the same handle."""
        if hasattr(spec, "bridge"):
            return spec
        from sae_atlas.saes.devices import resolve_device

        where, spec = str(resolve_device(device)), normalize_spec(spec)
        return self.cache.get(("model", json.dumps(spec, sort_keys=True), where),
                              lambda: load_model(spec, device=where))

    def run_locked(self, run: Callable[[], T]) -> T:
        """`run()` holding the model lock."""
        with self.model_lock:
            return run()

    def other(self, root: str | Path) -> AtlasContext:
        """The atlas at `root` as a second context: this one when `root` is this atlas, else
        opened once and kept for the life of this one (two-atlas operations and their reads)."""
        where = Path(root).resolve()
        if where == self.root.resolve():
            return self
        return self.cache.get(("other-atlas", str(where)), lambda: AtlasContext(where))

    def describe(self, problem: IntegrityError) -> str:
        """A damaged-file message with the file relative to the atlas."""
        return problem.describe(self.root)


@contextmanager
def models_locked(*contexts: AtlasContext) -> Iterator[None]:
    """Hold the model lock of each distinct context (in one order, so two operations over
    the same pair of atlases never wait on each other)."""
    distinct = sorted({id(c): c for c in contexts}.values(), key=lambda c: (str(c.root), id(c)))
    with ExitStack() as stack:
        for ctx in distinct:
            stack.enter_context(ctx.model_lock)
        yield
