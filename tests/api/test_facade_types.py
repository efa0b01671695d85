"""Every public `Atlas` method says what it returns: no bare polars frame (table results
are `Rows[RowT]` or a result type), no `dict[str, Any]` or `Any` (also inside another type,
say `list[dict[str, Any]]`), and no `**options: Any` forwarded to a service. A method that
must keep one is named in `ALLOWED` with the reason; an entry that no longer applies fails,
so the list only shrinks."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import polars as pl

from sae_atlas import Atlas

ALLOWED: dict[str, str] = {
    "train": "returns each trained dictionary's atlas.json record (dict[str, dict[str, Any]]), whose keys differ "
             "by kind (SAE, transcoder, crosscoder, cross-layer transcoder); landed untyped at 01:25 by the train "
             "operation (api/services/train.py), to be typed by its owner (asked in coord/results-note.md)",
}
"""Method name -> why its signature may still break the rule."""


def _public_methods() -> Iterator[tuple[str, Callable[..., Any]]]:
    for name, member in inspect.getmembers(Atlas):
        if name.startswith("_"):
            continue
        function = member.fget if isinstance(member, property) else member
        if callable(function) and not inspect.isclass(function):
            yield name, function


def _untyped(annotation: Any) -> str | None:
    """What in `annotation` is untyped (None: nothing)."""
    if annotation is Any:
        return "Any"
    if annotation is pl.DataFrame:
        return "pl.DataFrame"
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and args and args[1] is Any:
        return f"dict[{getattr(args[0], '__name__', args[0])}, Any]"
    for arg in args:
        if (found := _untyped(arg)) is not None:
            return found
    return None


def _problems(name: str, function: Callable[..., Any]) -> list[str]:
    hints = typing.get_type_hints(function)
    problems = []
    if "return" not in hints:
        problems.append(f"{name}: no return annotation")
    elif (found := _untyped(hints["return"])) is not None:
        problems.append(f"{name}: returns {found}")
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            problems.append(f"{name}: forwards **{parameter.name}")
    return problems


def test_every_public_method_has_a_typed_result_and_no_forwarded_options() -> None:
    methods = dict(_public_methods())
    assert len(methods) > 40  # the walk reaches the facade
    problems = [p for name, function in methods.items() if name not in ALLOWED for p in _problems(name, function)]
    assert not problems, "\n".join(problems)


def test_the_allowed_list_names_only_what_still_needs_it() -> None:
    methods = dict(_public_methods())
    stale = [name for name in ALLOWED if name not in methods or not _problems(name, methods[name])]
    assert not stale, f"typed now (or gone): drop {stale} from ALLOWED"


def test_the_walk_catches_each_untyped_form() -> None:
    """The check itself: each form it must refuse is refused, the typed ones pass."""

    class Sample:
        def frame(self) -> pl.DataFrame: ...
        def mapping(self) -> dict[str, Any]: ...
        def nested(self) -> list[dict[str, Any]] | None: ...
        def anything(self) -> Any: ...
        def forwards(self, **options: int) -> int: ...
        def bare(self): ...  # type: ignore[no-untyped-def]
        def typed(self, *, k: int = 3) -> dict[str, int]: ...

    found = {name: _problems(name, getattr(Sample, name)) for name in vars(Sample) if not name.startswith("_")}
    assert found == {
        "frame": ["frame: returns pl.DataFrame"], "mapping": ["mapping: returns dict[str, Any]"],
        "nested": ["nested: returns dict[str, Any]"], "anything": ["anything: returns Any"],
        "forwards": ["forwards: forwards **options"], "bare": ["bare: no return annotation"], "typed": []}


def test_every_result_gives_its_table_as_a_frame_property() -> None:
    """One convention for "this result as a polars frame": `.frame`, a property (as on `Rows`)."""
    import importlib
    import pkgutil

    import sae_atlas.api.results as results

    methods = []
    for info in pkgutil.iter_modules(results.__path__):
        module = importlib.import_module(f"{results.__name__}.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "frame" in vars(cls) and not isinstance(vars(cls)["frame"],
                                                                                             property):
                methods.append(f"{module.__name__}.{name}.frame")
    assert not methods, f"a method, not a property: {methods}"


FRAME_FIELDS = {"sae_atlas.api.results.analysis.AnalysisResult.table": "its columns vary with the analysis kind"}
"""Result fields that may still hold a bare polars frame -> why."""


def test_result_tables_are_rows_of_a_declared_type() -> None:
    """A table inside a result is `Rows[Row]` (typed rows, `.frame` for polars), not a frame."""
    import dataclasses
    import importlib
    import pkgutil

    import sae_atlas.api.results as results

    frames = []
    for info in pkgutil.iter_modules(results.__path__):
        module = importlib.import_module(f"{results.__name__}.{info.name}")
        for name, cls in inspect.getmembers(module, dataclasses.is_dataclass):
            if cls.__module__ != module.__name__:
                continue
            own = vars(cls).get("__annotations__", {})  # a subclass's inherited table counts once
            for field, hint in typing.get_type_hints(cls, include_extras=True).items():
                if field in own and pl.DataFrame in {hint, *_inner_types(hint)}:
                    frames.append(f"{module.__name__}.{name}.{field}")
    assert sorted(frames) == sorted(FRAME_FIELDS), f"polars frames in results: {frames}"


def _inner_types(hint: Any) -> Iterator[Any]:
    for arg in typing.get_args(hint):
        yield arg
        yield from _inner_types(arg)
