"""De-quantised GGUF models kept on disk, so that a GGUF model loads in about a second after
its first use instead of being de-quantised again (SmolLM2's Q4_1 file: ~20 s).

Where: `$SAE_ATLAS_CACHE_DIR`, else `$XDG_CACHE_HOME/sae-atlas`, else `~/.cache/sae-atlas`.
`SAE_ATLAS_MODEL_CACHE=0` turns the cache off (every load de-quantises).

```
gguf-hashes.json          {path: {size, mtime_ns, sha256}}: a GGUF is hashed once per version
models/<gguf sha256>/     config.json, model.safetensors, tokenizer files (a plain Hugging
                          Face folder) and manifest.json, written last: the source's sha256
                          and every other file's sha256
```

An entry is written into a temporary folder and renamed into place, so it is whole or
absent. Every load checks the entry's files against its manifest; an entry that fails (a
missing or changed file, a bad manifest) is never used: it is removed with a warning and
rebuilt from the GGUF.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sae_atlas.store.atomic import atomic_write_json, sha256_file

ENV_CACHE_DIR = "SAE_ATLAS_CACHE_DIR"
ENV_MODEL_CACHE = "SAE_ATLAS_MODEL_CACHE"
MANIFEST = "manifest.json"
HASHES = "gguf-hashes.json"
FORMAT = 1
Loaded = tuple[Any, Any]  # (Hugging Face causal LM in eval mode, tokenizer)


class CorruptEntry(Exception):
    """A cached model whose files do not match its manifest (never loaded)."""


def cache_dir() -> Path | None:
    """The cache folder, or None when `SAE_ATLAS_MODEL_CACHE` turns the cache off."""
    if os.environ.get(ENV_MODEL_CACHE, "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sae-atlas"


def source_sha256(path: Path, root: Path) -> str:
    """sha256 of a source file, computed once per (path, size, mtime) and remembered in
    `root/gguf-hashes.json` (a rewritten file gets a new mtime and is hashed again)."""
    stat = path.stat()
    key = str(path.resolve())
    memo_path = root / HASHES
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    known = memo.get(key)
    if isinstance(known, dict) and known.get("size") == stat.st_size and known.get("mtime_ns") == stat.st_mtime_ns:
        return str(known["sha256"])
    digest = sha256_file(path, chunk=1 << 24)
    memo[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    try:
        atomic_write_json(memo_path, memo)
    except OSError as exc:
        warnings.warn(f"cannot remember the hash of {path} in {memo_path} ({exc})", stacklevel=3)
    return digest


def _entry_files(entry: Path, digest: str) -> dict[str, str]:
    """`{file name: sha256}` of an entry's manifest; CorruptEntry unless the manifest names
    `digest` and every file it lists is there."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CorruptEntry(f"{entry / MANIFEST} is missing or not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("source_sha256") != digest:
        raise CorruptEntry(f"{entry / MANIFEST} does not describe the source with sha256 {digest}")
    files = manifest.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        raise CorruptEntry(f"{entry / MANIFEST} lists no weights")
    missing = [name for name in files if not (entry / name).is_file()]
    if missing:
        raise CorruptEntry(f"{entry / missing[0]} is missing")
    return files


def _mismatch(entry: Path, files: dict[str, str]) -> str | None:
    """The first file of `files` whose sha256 differs from its record, or None."""
    return next((name for name, expected in files.items() if sha256_file(entry / name, chunk=1 << 24) != expected),
                None)


def _load_entry(entry: Path, digest: str) -> Loaded:
    """The entry's model and tokenizer. The checksums are computed on a second thread while
    they load (hashing releases the GIL); a mismatch discards what was loaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = _entry_files(entry, digest)
    failure: Exception | None = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        checked = pool.submit(_mismatch, entry, files)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(entry))
            model = AutoModelForCausalLM.from_pretrained(str(entry), dtype=torch.float32)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            failure = exc
        bad = checked.result()
    if bad is not None:
        raise CorruptEntry(f"{entry / bad} does not match its checksum")
    if failure is not None:
        raise CorruptEntry(f"{entry} does not load ({failure})") from failure
    return model.eval(), tokenizer


def _save_plain(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save a de-quantised model as a plain float32 folder (transformers refuses to save one
    that still names its GGUF quantizer; the live model keeps it)."""
    quantizer, model.hf_quantizer = getattr(model, "hf_quantizer", None), None
    quant_config = model.config.__dict__.pop("quantization_config", None)
    try:
        model.save_pretrained(folder)
    finally:
        model.hf_quantizer = quantizer
        if quant_config is not None:
            model.config.quantization_config = quant_config
    tokenizer.save_pretrained(folder)


def _write_entry(entry: Path, digest: str, source: Path, loaded: Loaded) -> None:
    """Write the entry into a temporary folder beside it, then rename it into place (a
    concurrent writer that got there first wins; ours is dropped)."""
    tmp = entry.parent / f".tmp-{entry.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        _save_plain(*loaded, tmp)
        files = {p.name: sha256_file(p, chunk=1 << 24) for p in sorted(tmp.iterdir()) if p.is_file()}
        atomic_write_json(tmp / MANIFEST, {"format": FORMAT, "source_sha256": digest, "source": str(source),
                                           "files": files})
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Move a corrupt entry out of the way (so no reader picks it up), then delete it."""
    trash = entry.parent / f".corrupt-{entry.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def load_cached(source: Path, build: Callable[[], Loaded]) -> Loaded:
    """`(model, tokenizer)` of a GGUF file: from the cache when an entry for the file's
    sha256 verifies, else `build()` (de-quantise) and store the result for the next load."""
    root = cache_dir()
    if root is None:
        return build()
    try:
        root.mkdir(parents=True, exist_ok=True)
        digest = source_sha256(source, root)
    except OSError as exc:
        warnings.warn(f"model cache {root} is not usable ({exc}); de-quantising {source.name}", stacklevel=2)
        return build()
    entry = root / "models" / digest
    if entry.exists():
        try:
            return _load_entry(entry, digest)
        except CorruptEntry as exc:
            warnings.warn(f"cached model {entry} is damaged ({exc}); removing it and rebuilding it from "
                          f"{source}", stacklevel=2)
            _discard(entry)
    loaded = build()
    try:
        _write_entry(entry, digest, source, loaded)
    except OSError as exc:
        warnings.warn(f"cannot store the de-quantised {source.name} in {root} ({exc})", stacklevel=2)
    return loaded
