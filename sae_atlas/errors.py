"""The core layer of `errors`; its other layers: `sae_atlas.api.http.errors` (HTTP).

Named exceptions a user can cause; the HTTP layer maps them to 4xx responses."""

from __future__ import annotations

import os
import re

ATLAS_PLACEHOLDER = "<atlas>"
"""What stands for the atlas directory in a message that leaves its location out."""


class AtlasError(Exception):
    """Base class of every error sae-atlas raises on purpose."""

    http_status = 400


class NotFoundError(AtlasError, KeyError):
    """An id (SAE, hook, feature, analysis) that the atlas does not contain."""

    http_status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownHookError(NotFoundError):
    """A hook name that the model does not have."""


class InvalidInputError(AtlasError, ValueError):
    """Bad user input: wrong shape, dtype, d_in, empty corpus, out-of-range value."""


class IntegrityError(AtlasError):
    """A file that is missing, truncated, or whose checksum does not match."""

    http_status = 500

    def __init__(self, path: object, problem: str, repair: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.repair = repair
        super().__init__(f"{self.path}: {problem}. To repair: {repair}")

    def relative_path(self, root: str | os.PathLike[str]) -> str:
        """The damaged file relative to the atlas at `root` (as given when it lies elsewhere),
        so that listings and answers do not reveal where the atlas lives."""
        root = os.fspath(root)
        inside = os.path.commonpath([os.path.abspath(self.path), os.path.abspath(root)]) == os.path.abspath(root)
        return os.path.relpath(self.path, root) if inside else self.path

    def describe(self, root: str | os.PathLike[str]) -> str:
        """The one damaged-file message: the atlas-relative file, the problem and the repair
        (both with the atlas's location left out, `without_root`)."""
        return f"{self.relative_path(root)}: {without_root(self.problem, root)}. To repair: {without_root(self.repair, root)}"


def _root_forms(root: str | os.PathLike[str]) -> list[str]:
    """The spellings of `root` a message may hold (as given, absolute, resolved), longest first."""
    given = os.fspath(root)
    forms = {given.rstrip(os.sep) or given, os.path.abspath(given), os.path.realpath(given)}
    return sorted((f for f in forms if f not in ("", ".", os.sep)), key=len, reverse=True)


def without_root(text: str, root: str | os.PathLike[str]) -> str:
    """`text` with the location of the atlas at `root` left out, for answers to clients: a
    path under it written relative to it (`/srv/a/saes/x/cfg.json` -> `saes/x/cfg.json`) and
    the directory itself, e.g. a repair command's `--atlas /srv/a`, written `<atlas>`."""
    for form in _root_forms(root):
        start = r"(?<![\w.~/-])" + re.escape(form)
        text = re.sub(start + re.escape(os.sep) + r"(?=[\w.~-])", "", text)
        # a relative root as a bare word only where it is an option's value: it may be a common word
        bare = start if os.path.isabs(form) else r"(?<=--atlas )" + re.escape(form)
        text = re.sub(bare + r"(?!\.?[\w~/-])", ATLAS_PLACEHOLDER, text)
    return text
