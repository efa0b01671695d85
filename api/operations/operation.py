"""`Operation`: the parameters of one operation, defined once.

Each operation of the atlas (a graph, a text search, a contrast, ...) has one pydantic
model in `api.operations`: its parameters' names, types (`Literal`s for fixed choices),
defaults, bounds and descriptions. From it come

- the `Atlas` method: it validates its keywords with `Operation.of` (InvalidInputError
  naming each bad parameter) and hands the object to the service;
- the HTTP request body: the model itself, or a subclass that adds only what HTTP needs
  (validated strictly: `true` is not 1), so `/openapi.json` states the same bounds;
- the CLI options: the verb's parameters have the operation's names and defaults (a test
  holds them equal; they are not imported from here, so `sae-atlas --help` stays light)
  and declare no bounds: the values go through the same `Atlas` method, hence the same
  validation.

`api.operations.registry` lists every operation with its three surfaces;
`tests/api/test_operation_agreement.py` walks it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sae_atlas.api.operations.fields import PY_WHITESPACE
from sae_atlas.errors import InvalidInputError

WHICH_SAES = "the atlas's SAEs the operation reads (default: every one it can use)"
"""The one description of `saes`, the one name of "which dictionaries" in every operation."""


PATTERN_MEANINGS = {f"[^{PY_WHITESPACE}]": "needs at least one non-space character",
                    "[A-Za-z0-9]": "needs at least one letter or digit"}
"""What a text that fails one of these patterns lacks (said instead of the pattern)."""


def problems(exc: ValidationError) -> str:
    """A validation error as one line per bad parameter: `name: what is wrong` (a text
    that fails a pattern of `PATTERN_MEANINGS` said so, not as the pattern)."""
    def what(error: Any) -> str:
        if error["type"] == "string_pattern_mismatch" and error["ctx"]["pattern"] in PATTERN_MEANINGS:
            return PATTERN_MEANINGS[error["ctx"]["pattern"]]
        return error["msg"]

    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {what(e)}" for e in exc.errors())


def take_old_names(owner: str, renamed: Mapping[str, str], data: Mapping[str, Any],
                   defaults: Mapping[str, Any], *, stacklevel: int = 3) -> dict[str, Any]:
    """`data` with each old name of `renamed` (old -> new) given a value moved to its new
    name, with a DeprecationWarning naming `owner` (and the frame `stacklevel` up); an old
    name given as None is dropped; InvalidInputError where the new name is given too and is
    not at its default (`defaults`)."""
    data = dict(data)
    for old, new in renamed.items():
        value = data.pop(old, None)
        if value is None:
            continue
        if data.get(new) is not None and data[new] != defaults.get(new):
            raise InvalidInputError(f"{old!r} is the old name of {new!r}; give only {new!r}")
        warnings.warn(f"{owner}: {old!r} is deprecated, use {new!r}", DeprecationWarning, stacklevel=stacklevel)
        data[new] = value
    return data


Params = TypeVar("Params", bound="Operation")


class Operation(BaseModel):
    """The parameters of one operation (unknown names refused; strict over HTTP)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    renamed: ClassVar[dict[str, str]] = {}
    """Old parameter names still accepted (Python keywords, HTTP body fields): old -> new,
    with a DeprecationWarning naming the new one; an old name given as None is dropped, and
    one given beside the new name at its default takes its place (a method's keywords pass both)."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(old in data for old in cls.renamed):
            return data
        return take_old_names(cls.__name__, cls.renamed, data, {new: cls.default(new) for new in cls.renamed.values()})

    @classmethod
    def of(cls: type[Params], **values: Any) -> Params:
        """The parameters from Python keywords (lax: a tuple is a list, a numpy integer an
        int), InvalidInputError naming each bad one."""
        try:
            return cls.model_validate(values, strict=False)
        except ValidationError as exc:
            raise InvalidInputError(f"bad {cls.__name__} parameters: {problems(exc)}") from None

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of parameter `name`."""
        return cls.model_fields[name].get_default(call_default_factory=True)


class Lookup(Operation):
    """An operation whose parameters HTTP takes as URL query parameters (`params:
    Annotated[Lookup, Query()]` on a GET route): text there, so validated laxly (`?k=3`)."""

    model_config = ConfigDict(extra="forbid", strict=False)
