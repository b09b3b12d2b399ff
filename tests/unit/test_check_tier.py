"""`make check` runs the tests that need no process of their own (`-m "not processes and not slow"`
over tests/unit, tests/integration, tests/aio and tests/security). A module there that starts a
process — a server or the CLI through subprocess, multiprocessing, a real etcd, a child it signals —
must say so with the `processes` mark, or the fast tier would quietly start doing what it exists to
avoid (and could leave children behind when interrupted)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKED_FOLDERS = ("unit", "integration", "aio", "security")
# Names whose use in a test module means it starts (or signals) a process of its own.
PROCESS_NAMES = frozenset({
    "subprocess", "multiprocessing", "create_subprocess_exec", "create_subprocess_shell",
    "running_etcd", "etcd_server", "etcd_url", "send_signal",
})


def _names(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
    return found


def _module_marks(tree: ast.Module) -> set[str]:
    """The marks named in a module-level `pytestmark = ...` (one mark or a list of them)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
    return set()


def _process_modules_without_the_mark(root: pathlib.Path) -> list[str]:
    missing = []
    for folder in CHECKED_FOLDERS:
        for path in sorted((root / "tests" / folder).glob("test_*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), filename=relative)
            used = _names(tree) & PROCESS_NAMES
            if used and "processes" not in _module_marks(tree):
                missing.append(f"{relative} uses {sorted(used)}")
    return missing


def test_every_module_that_starts_a_process_is_marked() -> None:
    assert _process_modules_without_the_mark(ROOT) == []


def test_an_unmarked_module_that_starts_a_process_is_found(tmp_path: pathlib.Path) -> None:
    for folder in CHECKED_FOLDERS:
        (tmp_path / "tests" / folder).mkdir(parents=True)
    (tmp_path / "tests/integration/test_spawns.py").write_text(
        "import subprocess\n\ndef test_x():\n    subprocess.run(['true'])\n")
    (tmp_path / "tests/integration/test_marked.py").write_text(
        "import subprocess\nimport pytest\n\npytestmark = [pytest.mark.processes, pytest.mark.timeout(5)]\n")
    (tmp_path / "tests/aio/test_etcd.py").write_text("def test_x(etcd_url):\n    pass\n")
    (tmp_path / "tests/unit/test_plain.py").write_text("def test_x():\n    assert 1\n")
    assert _process_modules_without_the_mark(tmp_path) == [
        "tests/integration/test_spawns.py uses ['subprocess']",
        "tests/aio/test_etcd.py uses ['etcd_url']",
    ]
