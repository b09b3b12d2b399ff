"""`make run` installs only what a server needs; `make test` adds the test and Spark extras.

`make -n` against a virtualenv that does not exist shows what a fresh clone would run, without
running it. The second test checks that what a server imports is in the base dependencies, so
`pip install -e .` alone really is enough to run one.
"""

from __future__ import annotations

import ast
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dry_run(target: str, venv: pathlib.Path) -> list[str]:
    done = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def pip_installs(lines: list[str]) -> list[str]:
    """What each `pip install` line installs from this project (upgrades of pip left out)."""
    return [line.split(" -e ", 1)[1].strip() for line in lines if "pip install" in line and " -e " in line]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_installs_no_extras_and_make_test_installs_test_and_spark(tmp_path):
    venv = tmp_path / "fresh-venv"
    run = dry_run("run", venv)
    assert any(line.endswith(f"-m venv {venv}") for line in run), run  # a fresh clone needs nothing else
    assert pip_installs(run) == ["."], run
    assert any("dmq server" in line for line in run), run

    test = dry_run("test", venv)
    [spec] = pip_installs(test)
    extras = set(re.fullmatch(r"'?\.\[([a-z,]+)\]'?", spec).group(1).split(","))  # type: ignore[union-attr]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = set().union(*(requirements_of(extra, declared) for extra in extras))
    assert {"pytest", "pytest-xdist", "pyspark", "ruff"} <= wanted, (spec, wanted)
    assert any("pytest" in line and " -n " in line for line in test), test  # in xdist's workers


def requirements_of(extra: str, declared: dict[str, list[str]]) -> set[str]:
    """Distribution names an extra pulls in, through self-references such as "dmq[test,spark]"."""
    names: set[str] = set()
    for req in declared[extra]:
        if req.startswith("dmq["):
            for inner in req[4:req.index("]")].split(","):
                names |= requirements_of(inner.strip(), declared)
        else:
            names.add(re.split(r"[<>=\[;]", req)[0].strip().lower())
    return names


def _optional_nodes(tree: ast.AST) -> set[int]:
    """Imports that may fail by design: under `if TYPE_CHECKING:` or in `try: ... except ImportError`."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        optional = (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)) or (
            isinstance(node, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in node.handlers))
        if optional:
            for inner in node.body:
                skipped |= {id(n) for n in ast.walk(inner)}
    return skipped


def _third_party_imports(folder: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        optional = _optional_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("dmq", "__future__")}


def test_what_a_server_imports_is_in_the_base_dependencies():
    base = {re.split(r"[<>=\[;]", req)[0].strip().lower()
            for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    providers = metadata.packages_distributions()
    server_code = [ROOT / "proto", ROOT / "broker", ROOT / "coordinator", ROOT / "client" / "cli"]
    missing = {}
    for folder in server_code:
        for module in _third_party_imports(folder):
            dists = {d.lower() for d in providers.get(module, [])}
            if not dists & base:
                missing[module] = sorted(dists)
    # grpc_tools builds the stubs (proto/generate.py, run by `make proto`), not a server.
    missing.pop("grpc_tools", None)
    assert not missing, f"imported by server code but not in [project] dependencies: {missing}"
