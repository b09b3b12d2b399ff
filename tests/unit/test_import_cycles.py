"""No import cycles among dmq's modules.

An import runs when the module is loaded or when the function holding it is first called; either
way the importer needs the imported module at run time, so both count: an import moved into a
function to dodge a cycle is still the cycle. Imports under `if TYPE_CHECKING:` never run; they
are checked separately against a list of the type-only cycles known today, so none is added.

An edge goes to the module an import names (`from a import b` names a.b when b is a module,
otherwise a); the packages an import passes through are not edges of their own, since every
module of a package would otherwise be in a cycle with its `__init__`.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest
from test_import_rules import _module_name, _resolve, _sources

# Cycles that exist only through `if TYPE_CHECKING:` imports (annotations naming CoordinatorNode
# and the services), each a set of modules. The broker's circle (node, service, queue, events,
# replication) is gone: its modes take narrow Protocols (issue 27, "modes under the node"), and a
# type-only import of the node or a servicer from below brings the circle back and fails here.
# Remove a set once its cycle is broken; the test says so.
KNOWN_TYPE_ONLY_CYCLES: list[frozenset[str]] = [
    frozenset({"dmq.coordinator.group_service", "dmq.coordinator.metrics", "dmq.coordinator.node"}),
    # record_ids appends for the partition log and is handed it (`plog`) as an argument.
    frozenset({"dmq.broker.log.partition", "dmq.broker.log.record_ids"}),
]


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) block."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


@functools.cache
def _parsed() -> dict[str, tuple[pathlib.Path, ast.Module]]:
    """Every module's syntax tree, parsed once for the tests here (read, never changed)."""
    return {
        _module_name(p): (p, ast.parse(p.read_text(encoding="utf-8"), filename=str(p))) for p in _sources()
    }


@functools.cache
def import_graph(*, type_only_too: bool) -> dict[str, set[str]]:
    """Module -> the dmq modules it imports (see the module docstring for what counts); built
    once per kind for the tests here, which copy it before changing it."""
    paths = _parsed()
    graph: dict[str, set[str]] = {}
    for module, (path, tree) in paths.items():
        skip = set() if type_only_too else _type_checking_nodes(tree)
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                prefix, *members = _resolve(module, path.name == "__init__.py", node)
                names = [m for m in members if m in paths] or [prefix]
            else:
                continue
            edges.update(n for n in names if n in paths and n != module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, sorted(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component: set[str] = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_cycles_at_run_time() -> None:
    graph = import_graph(type_only_too=False)
    assert len(graph) > 50, "the walk found too few modules: the layout moved, update test_import_rules.PACKAGES"
    found = cycles(graph)
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in found
    )


def test_type_only_cycles_are_the_known_ones() -> None:
    found = cycles(import_graph(type_only_too=True))
    new = [c for c in found if not any(c <= known for known in KNOWN_TYPE_ONLY_CYCLES)]
    assert not new, "new import cycles through `if TYPE_CHECKING:` imports (name a narrow interface instead):\n" + (
        "\n".join(" <-> ".join(sorted(c)) for c in new)
    )
    in_a_cycle = set().union(*found) if found else set()
    gone = sorted(m for known in KNOWN_TYPE_ONLY_CYCLES for m in known - in_a_cycle)
    assert not gone, f"no longer in an import cycle; remove from KNOWN_TYPE_ONLY_CYCLES: {gone}"


def test_cycles_finds_a_cycle_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["f", "g"]]


def test_function_imports_count_and_type_checking_ones_do_not(tmp_path: pathlib.Path) -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dmq.broker import node\n"
        "def f():\n    from dmq.broker import service\n"
    )
    inside = _type_checking_nodes(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "dmq.broker"]
    assert [id(n) in inside for n in imports] == [True, False]


# The broker's modes hang under the node: they are handed narrow Protocols (replication/ports.py,
# queue/ports.py, the servicers' hosts), never the node or the Broker servicers.
BROKER_MODES = ("dmq.broker.queue", "dmq.broker.events", "dmq.broker.replication")
ABOVE_THE_MODES = ("dmq.broker.node", "dmq.broker.service", "dmq.broker.servicers")


def test_broker_modes_name_no_node_and_no_servicer() -> None:
    graph = import_graph(type_only_too=True)
    modes = [m for m in graph if any(m == p or m.startswith(p + ".") for p in BROKER_MODES)]
    assert len(modes) > 15, "the walk found too few modules of the broker's modes: update BROKER_MODES"
    reaching = sorted(f"{m} -> {t}" for m in modes for t in graph[m] if t in ABOVE_THE_MODES)
    assert not reaching, "broker modes importing the node or a servicer (hand them a Protocol):\n" + "\n".join(reaching)


@pytest.mark.parametrize(
    "mode", ["dmq.broker.queue.manager", "dmq.broker.events.service", "dmq.broker.replication.fetcher"]
)
@pytest.mark.slow
def test_a_mode_naming_the_node_again_is_a_new_cycle(mode: str) -> None:
    """The allow-list no longer covers the broker's old circle: one type-only import of the node
    from a mode (as before issue 27's item 4) is a cycle the test above refuses."""
    graph = {module: set(edges) for module, edges in import_graph(type_only_too=True).items()}
    graph[mode].add("dmq.broker.node")
    new = [c for c in cycles(graph) if not any(c <= known for known in KNOWN_TYPE_ONLY_CYCLES)]
    assert any(mode in c and "dmq.broker.node" in c for c in new)
