"""Shared by the layering tests: the first import cycle of a module or package graph."""

from __future__ import annotations


def assert_no_cycle(graph: dict[str, set[str]], what: str) -> None:
    """AssertionError naming the first cycle found in `graph` (node -> the nodes it imports),
    walked depth-first in sorted order."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError(f"{what}: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
