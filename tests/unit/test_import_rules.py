"""The layout's import rules (DESIGN.md, "Layout"), checked on every module's imports.

`proto` imports nothing of ours; `broker` never imports `coordinator` or `client`; `coordinator`
never imports `broker` or `client`; the client library (dmq.client outside dmq.client.cli) never
imports the CLI. Imports are read with `ast` from the source, so imports inside functions (the
lazy ones) count as much as those at the top: a rule broken only on a rarely taken path is still
broken. Relative imports are resolved against the importing module.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The folders and the import names they are mapped to ([tool.setuptools.package-dir]).
PACKAGES = {"proto": "dmq.proto", "broker": "dmq.broker", "coordinator": "dmq.coordinator", "client": "dmq.client"}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The absolute names an ImportFrom brings in (`from a import b` may name module a.b)."""
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, nested ones included."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, name) for name in _resolve(module, path.name == "__init__.py", node))
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violation(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when the layout allows it."""
    if not _within(imported, "dmq"):
        return None  # not ours
    if _within(importer, "dmq.proto"):
        if not _within(imported, "dmq.proto"):
            return "proto imports nothing of ours"
    elif _within(importer, "dmq.broker"):
        if _within(imported, "dmq.coordinator") or _within(imported, "dmq.client"):
            return "broker never imports coordinator or client"
    elif _within(importer, "dmq.coordinator"):
        if _within(imported, "dmq.broker") or _within(imported, "dmq.client"):
            return "coordinator never imports broker or client"
    elif _within(importer, "dmq.client") and not _within(importer, "dmq.client.cli"):
        if _within(imported, "dmq.client.cli"):
            return "the client library never imports the CLI"
    return None


def _sources() -> list[pathlib.Path]:
    return sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py"))


def test_the_tree_keeps_the_import_rules() -> None:
    sources = _sources()
    assert len(sources) > 50, "the walk found too few modules: the layout moved, update PACKAGES"
    broken: dict[tuple[pathlib.Path, int], str] = {}  # one line per import statement
    for path in sources:
        for line, name in imports_of(path):
            why = violation(_module_name(path), name)
            if why is not None:
                broken.setdefault((path, line), f"{path.relative_to(ROOT)}:{line}: {_module_name(path)} imports {name} ({why})")
    assert not broken, "imports across the layout's rules:\n" + "\n".join(broken.values())


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("dmq.proto.wire", "dmq.proto.records", True),
        ("dmq.proto.wire", "dmq.broker.log", False),
        ("dmq.proto", "dmq.client.errors", False),
        ("dmq.broker.service", "dmq.proto.limits", True),
        ("dmq.broker.node", "dmq.coordinator.metadata", False),
        ("dmq.broker.node", "dmq.client", False),
        ("dmq.coordinator.node", "dmq.broker", False),
        ("dmq.coordinator.group_service", "dmq.client.errors", False),
        ("dmq.coordinator.group.state", "dmq.coordinator.store", True),
        ("dmq.client.producer", "dmq.client.cli", False),
        ("dmq.client.spark._worker", "dmq.client.cli.logging_setup", False),
        ("dmq.client.cli.servers", "dmq.broker.node", True),
        ("dmq.client.cli.runner", "dmq.coordinator.node", True),
        ("dmq.client.producer", "dmq.client.clients", True),  # only its name starts like "cli"
        ("dmq.broker", "grpc", True),
    ],
)
def test_the_rules_themselves(importer: str, imported: str, allowed: bool) -> None:
    assert (violation(importer, imported) is None) is allowed


def test_relative_and_nested_imports_are_resolved(tmp_path: pathlib.Path) -> None:
    tree = ast.parse("from ..coordinator import node\ndef f():\n    from . import log\n")
    relative, nested = (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert "dmq.coordinator.node" in _resolve("dmq.broker.service", False, relative)
    assert "dmq.broker.log" in _resolve("dmq.broker.service", False, nested)
    assert "dmq.broker.log" in _resolve("dmq.broker", True, nested)
