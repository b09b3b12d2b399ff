"""The layout's import rules (DESIGN.md, "Layout"), checked on every module's imports.

`proto` imports nothing of ours, and the contract (dmq.proto outside dmq.proto.server) not even the
servers' runtime (dmq.proto.server); `broker` never imports `coordinator` or `client`;
`coordinator` never imports `broker` or `client`; the client library (dmq.client outside
dmq.client.cli) never imports the CLI; and nothing of dmq.client, the CLI included, imports server
code (dmq.broker, dmq.coordinator, dmq.proto.server) except the modules in SERVER_STARTERS, which
exist to start servers in-process. Imports are read with `ast` from the source, so imports inside functions (the
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
# What only the servers run: the client may not import it, so it cannot depend on server internals.
SERVER_CODE = ("dmq.broker", "dmq.coordinator", "dmq.proto.server")
# The one exception (DESIGN.md "Layout": the program that starts servers is a process owner and
# lives with the CLI): module -> why it may import server code. Kept narrow: a module that no
# longer imports server code must leave the list (test_every_server_starter_starts_servers).
SERVER_STARTERS = {
    "dmq.client.cli.runner": "builds and runs the nodes in-process (dmq server, LocalCluster, ClusterThread)",
    "dmq.client.cli.servers": "the `dmq server|coordinator|broker` commands: the servers' settings and data-dir locks",
}


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
        if not _within(importer, "dmq.proto.server") and _within(imported, "dmq.proto.server"):
            return "the contract never imports the servers' runtime"
    elif _within(importer, "dmq.broker"):
        if _within(imported, "dmq.coordinator") or _within(imported, "dmq.client"):
            return "broker never imports coordinator or client"
    elif _within(importer, "dmq.coordinator"):
        if _within(imported, "dmq.broker") or _within(imported, "dmq.client"):
            return "coordinator never imports broker or client"
    elif _within(importer, "dmq.client"):
        if not _within(importer, "dmq.client.cli") and _within(imported, "dmq.client.cli"):
            return "the client library never imports the CLI"
        if importer not in SERVER_STARTERS and any(_within(imported, s) for s in SERVER_CODE):
            return "the client never imports server code (only the modules that start servers may)"
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
        # the client never reaches into server code; only the server starters may
        ("dmq.client.admin", "dmq.coordinator.metadata", False),
        ("dmq.client.admin", "dmq.proto.topic_settings", True),
        ("dmq.client.producer", "dmq.proto.server.server_errors", False),
        ("dmq.client.spark._worker", "dmq.proto.server.metrics", False),
        ("dmq.client.cli.topics", "dmq.broker.log", False),  # the CLI too, beyond the starters
        ("dmq.client.cli.runner", "dmq.proto.server.metrics", True),
        ("dmq.client.cli.servers", "dmq.proto.server.dirlock", True),
        ("dmq.client._cluster", "dmq.proto.security.settings", True),
        ("dmq.client._cluster", "dmq.proto.serverless", True),  # only its name starts like "server"
        # the contract never depends on the servers' runtime; the runtime builds on the contract
        ("dmq.proto.records", "dmq.proto.server.handlers", False),
        ("dmq.proto.security.settings", "dmq.proto.server.security.interceptor", False),
        ("dmq.proto.server.server_errors", "dmq.proto.names", True),
        ("dmq.proto.server.security.interceptor", "dmq.proto.security.settings", True),
        ("dmq.proto.server.metrics", "dmq.broker.metrics", False),
        ("dmq.broker.node", "dmq.proto.server.dirlock", True),
        ("dmq.coordinator.node", "dmq.proto.server.metrics", True),
    ],
)
def test_the_rules_themselves(importer: str, imported: str, allowed: bool) -> None:
    assert (violation(importer, imported) is None) is allowed


def test_every_server_starter_starts_servers() -> None:
    """The exception stays narrow: each listed module exists and still imports server code."""
    sources = {_module_name(p): p for p in _sources()}
    for module in SERVER_STARTERS:
        assert module in sources, f"{module} is gone: take it off SERVER_STARTERS"
        names = [name for _, name in imports_of(sources[module])]
        assert any(_within(n, s) for n in names for s in SERVER_CODE), (
            f"{module} no longer imports server code: take it off SERVER_STARTERS"
        )


def test_relative_and_nested_imports_are_resolved(tmp_path: pathlib.Path) -> None:
    tree = ast.parse("from ..coordinator import node\ndef f():\n    from . import log\n")
    relative, nested = (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert "dmq.coordinator.node" in _resolve("dmq.broker.service", False, relative)
    assert "dmq.broker.log" in _resolve("dmq.broker.service", False, nested)
    assert "dmq.broker.log" in _resolve("dmq.broker", True, nested)
