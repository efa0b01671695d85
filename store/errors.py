"""Named exceptions a user can cause; the HTTP layer maps them to 4xx responses."""

from __future__ import annotations

import os


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
        """The one damaged-file message: the atlas-relative file, the problem and the repair."""
        return f"{self.relative_path(root)}: {self.problem}. To repair: {self.repair}"
